"""GPUlayer on Kubernetes: the API client (api.py) and the control plane pod's init step (init.py). docs/kubernetes.md."""
