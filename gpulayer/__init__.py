"""GPUlayer: a GPU job and service scheduler on one SQLite file.

The Python client::

    import gpulayer as gl
    client = gl.connect()                       # GPULAYER_URL / GPULAYER_TOKEN, or `gpulayer up`
    job = client.submit(gl.job(["python", "train.py"], gpus=1, source="."))
    job.wait(); print(job.logs())

See docs/python.md.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulayer.client.api import Client, connect
    from gpulayer.client.errors import (
        ApiError, BadInput, ClientError, Conflict, ConnectionFailed, Forbidden, InvalidRequest, NotFound,
        ProtocolMismatch, ServiceNotStarting, Unauthorized, WaitTimeout,
    )
    from gpulayer.client.jobfile import job_from_file
    from gpulayer.client.jobs import FINISHED_STATES, Job
    from gpulayer.client.settings import resolve_settings, server_configured
    from gpulayer.client.specs import job, service

__version__ = "0.1.0"

__all__ = [
    "ApiError", "BadInput", "Client", "ClientError", "Conflict", "ConnectionFailed", "FINISHED_STATES",
    "Forbidden", "InvalidRequest", "Job", "NotFound", "ProtocolMismatch", "ServiceNotStarting", "Unauthorized",
    "WaitTimeout", "connect", "job", "job_from_file", "resolve_settings", "server_configured", "service",
    "__version__",
]

# The client's names load on first use, so that `import gpulayer.protocol` (and the agent's other imports of
# gpulayer) loads the protocol alone, not the client and requests.
_CLIENT_NAMES = {
    "gpulayer.client.api": ("Client", "connect"),
    "gpulayer.client.errors": ("ApiError", "BadInput", "ClientError", "Conflict", "ConnectionFailed", "Forbidden",
                               "InvalidRequest", "NotFound", "ProtocolMismatch", "ServiceNotStarting", "Unauthorized",
                               "WaitTimeout"),
    "gpulayer.client.jobfile": ("job_from_file",),
    "gpulayer.client.jobs": ("FINISHED_STATES", "Job"),
    "gpulayer.client.settings": ("resolve_settings", "server_configured"),
    "gpulayer.client.specs": ("job", "service"),
}
_HOME = {name: module for module, names in _CLIENT_NAMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name == "client":  # `gl.client.Settings`: the subpackage, as an eager import made it an attribute
        return importlib.import_module("gpulayer.client")
    if name not in _HOME:
        raise AttributeError(f"module 'gpulayer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
