"""The worker's GPUs: every NVML call, the inventory it offers, the health watcher and the utilization samples."""
