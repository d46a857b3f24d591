"""The Python client: HTTP only, nothing of the server (`import gpulayer as gl` re-exports it).

    api        Client, connect()
    jobs       Job: a submitted job's state, logs, waits, endpoints, outputs
    settings   where to connect (GPULAYER_URL, client.json)
    errors     one exception class per kind of refusal
    specs      gl.job(), gl.service(): JobSpecs from keyword arguments
    transfers  artifact uploads and verified downloads
    bundle     `--source DIR` packed deterministically
"""
from gpulayer.client.api import Client, connect
from gpulayer.client.errors import (
    ApiError, BadInput, ClientError, Conflict, ConnectionFailed, Forbidden, InvalidRequest, NotFound,
    ProtocolMismatch, ServiceNotStarting, Unauthorized, WaitTimeout,
)
from gpulayer.client.jobs import FINISHED_STATES, Job
from gpulayer.client.settings import Settings, read_client_file, resolve_settings, server_configured
from gpulayer.client.specs import job, service

__all__ = [
    "ApiError", "BadInput", "Client", "ClientError", "Conflict", "ConnectionFailed", "FINISHED_STATES", "Forbidden",
    "InvalidRequest", "Job", "NotFound", "ProtocolMismatch", "ServiceNotStarting", "Settings", "Unauthorized",
    "WaitTimeout",
    "connect", "job", "read_client_file", "resolve_settings", "server_configured", "service",
]
