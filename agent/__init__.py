"""The GPUlayer worker agent.

Runs on a GPU host, dials out to the control plane over HTTPS and runs the
tasks it is given (docs/protocol.md, docs/workers.md). It imports nothing of
the control plane: only the standard library, ``requests``, ``pynvml``,
``gpulayer.protocol`` (the wire: the typed Assignment it is handed), ``gpulayer.relaylink``
(the relay's WebSocket and streams) and ``gpulayer.proc`` (its allocator and ending).
"""

__version__ = "0.1.0"

#: The wire protocol version this agent speaks (header X-GpuLayer-Protocol).
PROTOCOL = 1
