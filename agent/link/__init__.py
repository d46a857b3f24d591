"""The agent's HTTP link to the control plane: requests and their retries, connections, TLS trust, the address it
advertises, and the task log lines it ships."""
