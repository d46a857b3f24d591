"""The control plane: store, scheduler, HTTP front end, security, provisioning."""
