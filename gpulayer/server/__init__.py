"""The control plane: store, scheduler, the /v1 app (http/) and the servers that carry it (frontends/), relay,
notifications, security, replication, provisioning; the field validators."""
