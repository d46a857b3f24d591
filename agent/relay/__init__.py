"""The relay: the one WebSocket the control plane asks for (link.py), and one module per stream kind it carries
(exec, shell, ssh with the SSH server run inside the task, tcp)."""
