"""The control plane: store, scheduler, HTTP front end, security, replication, provisioning; the field validators."""
