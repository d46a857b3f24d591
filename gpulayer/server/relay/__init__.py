"""The relay: byte streams between clients and the agents that dial out, on the control plane's own port.

`hub.Hub` is the RSGI WebSocket handler granian_bridge.Bridge hands `scope.proto == "ws"` to: agents' links
(`GET /v1/worker/relay`) and clients' streams (`GET /v1/jobs/{id}/relay`), forwarded on granian's asyncio
loop; `conn.Conn` is one accepted WebSocket; `routes` holds the streams and the credit the hub passes on
(capped); `opens` checks what a client's URL and OPEN say; `rights` checks a socket's rights again when they
change. docs/architecture.md, "The relay", says how it fits together.
"""
