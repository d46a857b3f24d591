"""The relay's routes as plain HTTP sees them: a WebSocket upgrade never gets here under granian (the relay,
gpulayer/server/relay/hub.py, takes it in granian_bridge.Bridge), so what does is a GET without one (400), or
any request under `--http cheroot`, which serves no WebSocket, or with `--front-ends N > 1` (501)."""

from __future__ import annotations

import re

from gpulayer.server.errors import GpulayerError


# A worker's relay link and a client's stream would land on different front-end processes (server/multiproc/).
MULTIPROCESS = ("this control plane serves with several front-end processes (--front-ends N > 1), which carry no relay "
                "(exec, shell, port forwarding) nor ingress: serve with --front-ends 1 for them")


class RelayUnavailable(GpulayerError):
    code = "relay_unavailable"
    status = 501


class WebSocketRequired(GpulayerError):
    code = "websocket_required"
    status = 400


class _RelayRoute:
    def __init__(self, deps):
        self.deps = deps

    def on_get(self, req, resp, **params):
        if self.deps.config.front_ends > 1:
            raise RelayUnavailable(MULTIPROCESS)
        if self.deps.config.http != "granian":
            raise RelayUnavailable(
                f"this control plane serves HTTP with {self.deps.config.http}, which carries no "
                "WebSocket: the relay (exec) needs the default front end (server start "
                "--http granian)"
            )
        raise WebSocketRequired(f'{req.path} is a WebSocket (Upgrade: websocket): docs/protocol.md, "The relay"')


class AgentRelay(_RelayRoute):
    """GET /v1/worker/relay: an agent's relay link."""

    auth = ("worker",)


class JobRelay(_RelayRoute):
    """GET /v1/jobs/{id}/relay: a client's relay streams into one of the job's tasks."""


#: What the ingress serves (gpulayer/server/relay/ingress.py), as a falcon sink's prefix.
INGRESS_PATHS = re.compile(r"/ingress(/|$)")


class IngressUnavailable:
    """The sink of /ingress/...: a service's ingress, which granian's bridge hands to gpulayer/server/relay/ingress.py
    before falcon sees it; here only under `--http cheroot`, which cannot stream it (501)."""

    def __init__(self, deps):
        self.deps = deps

    def __call__(self, req, resp, **params):
        if self.deps.config.front_ends > 1:
            raise RelayUnavailable(MULTIPROCESS)
        raise RelayUnavailable(
            f"this control plane serves HTTP with {self.deps.config.http}: the ingress streams on the default "
            "front end only (server start --http granian)"
        )
