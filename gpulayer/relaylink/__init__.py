"""The relay link as the agent and the client run it: a WebSocket to the control plane, streams over it.

wsclient.py is a blocking RFC 6455 client; streams.py multiplexes the relay's frames (gpulayer/protocol/relay.py)
over one such WebSocket for threads, keeping each stream's credit; pipe.py joins a TCP socket to a `tcp` stream.
Shared by the agent and the client (the CLI's exec, shell, port-forward and ssh-proxy); imports nothing of
gpulayer but the protocol (tests/unit/test_import_contracts.py).
"""
