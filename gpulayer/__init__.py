"""GPUlayer: a GPU job and service scheduler on one SQLite file.

The Python client::

    import gpulayer as gl
    client = gl.connect()                       # GPULAYER_URL / GPULAYER_TOKEN, or `gpulayer up`
    job = client.submit(gl.job(["python", "train.py"], gpus=1, source="."))
    job.wait(); print(job.logs())

See docs/python.md.
"""
from __future__ import annotations

from gpulayer.client.api import (
    FINISHED_STATES, Client, Job, connect, resolve_settings, server_configured,
)
from gpulayer.client.errors import (
    ApiError, BadInput, ClientError, Conflict, ConnectionFailed, Forbidden, InvalidRequest, NotFound,
    ProtocolMismatch, Unauthorized, WaitTimeout,
)
from gpulayer.client.jobfile import job_from_file
from gpulayer.client.specs import job, service

__version__ = "0.1.0"

__all__ = [
    "ApiError", "BadInput", "Client", "ClientError", "Conflict", "ConnectionFailed", "FINISHED_STATES",
    "Forbidden", "InvalidRequest", "Job", "NotFound", "ProtocolMismatch", "Unauthorized",
    "WaitTimeout", "connect", "job", "job_from_file", "resolve_settings", "server_configured", "service",
    "__version__",
]
