"""The front ends: the two servers that carry the /v1 app (server/http/) to sockets, and what they patch.

Both reach into their server's private parts, so they sit here, fenced, where a version bump of either is
read in one folder:

- granian (the default; granian_server.py, granian_bridge.py, granian_guard.py): its RSGI worker is driven in
  this process through `granian._granian`, `granian._futures` and `granian._loops` (its public entry point runs
  the app in worker processes; the control plane needs it in its own, the one writer of the state file), so the
  version is pinned to one minor release (pyproject.toml). The WSGI app runs behind an RSGI bridge, because
  granian's WSGI worker lets a slow body hold a Python thread with no deadline; the guard closes stalled
  connections when granian's one bound, its backpressure, is reached;
- cheroot (`--http cheroot`; cheroot_server.py, cheroot_connections.py): its connection manager's accept and
  selector (`_connections._from_server_socket`, `_connections._selector`) and its HTTPConnection/HTTPRequest are
  subclassed or replaced, so that a TLS handshake, a request head and a small body are read off the worker
  threads (slow clients hold none) and a shortage of file descriptors is answered with a 503;
- bodies.py: the framing and body rules both apply alike.

The contract (tests/unit/test_import_contracts.py): nothing imports this package but the process entries
(server/process.py, and server/multiproc/frontend.py for a front-end process of `--front-ends N`); the /v1 app
imports nothing of it; it imports nothing of the app, the scheduler or the store
(what it shares with the app, the error shape and the body errors, sits below both in server/errors.py).
"""
