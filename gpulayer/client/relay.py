"""Streams into a running task through the control plane's relay: `gpulayer exec`, `Job.exec` (docs/access.md).

One WebSocket to `GET /v1/jobs/{id}/relay` (the client's token, the client's CA), one OPEN with the command,
then stdin goes up as DATA (EOF at its end) and stdout / stderr come back as DATA / EXT_DATA within the flow
control of gpulayer/protocol/relay.py, until a CLOSE brings the exit code. A refusal comes back as an
`ApiError` of the server's status: at the handshake (401, 403, 400) or in the CLOSE (`error`, `code`,
`status`: 404 no such job for you, 403 not yours, 409 not running or the relay unavailable there, 429 caps,
504 the agent did not connect).
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol
from urllib.parse import urlencode

from gpulayer.client.errors import _BY_STATUS, ApiError, ConnectionFailed
from gpulayer.protocol.control import Close, ExecOpen, is_int
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import CLOSE, DATA, EXT_DATA, STDERR
from gpulayer.relaylink.streams import Link, LinkLost, Stream, connect

STDIN_CHUNK = 64 * 1024


class RelayClient(Protocol):
    """What the relay needs of a Client (gpulayer.client.api.Client)."""

    url: str
    session: Any


def open_exec(client: RelayClient, job_id: int, argv: list[str], index: int | None = None) -> tuple[Link, Stream]:
    """A connected link and its exec stream running `argv`; ConnectionFailed, or ApiError at the handshake."""
    return open_stream(client, job_id, to_wire(ExecOpen(argv=list(argv))), index)


def open_stream(client: RelayClient, job_id: int, fields: dict, index: int | None = None) -> tuple[Link, Stream]:
    """A connected link and one stream on it, opened with `fields` (its `kind` and the kind's own: the wire form of
    an ExecOpen, ShellOpen, TcpOpen or SshOpen of gpulayer/protocol/control.py)."""
    query = {"kind": fields["kind"], **({"index": str(index)} if index is not None else {})}
    url = f"{client.url}/v1/jobs/{int(job_id)}/relay?{urlencode(query)}"
    token = (client.session.headers.get("Authorization") or "").removeprefix("Bearer ")
    try:
        ws = connect(url, token, client.session.verify)
    except Exception as exc:
        raise _handshake_error(exc, client.url) from None
    link = Link(ws)
    link.start()
    try:
        stream = link.open(fields)
    except LinkLost as exc:
        raise ConnectionFailed(f"the relay connection to {client.url} failed: {exc}") from None
    return link, stream


def _handshake_error(exc: Exception, url: str) -> Exception:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is None:
        return ConnectionFailed(f"cannot open the relay at {url}: {type(exc).__name__}: {exc}")
    code, message, body = "http_" + str(status), "", {}
    try:
        body = json.loads(getattr(response, "body", b"") or b"{}")
        code, message = body["error"]["code"], body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    if not message:
        message = {
            401: "the control plane refused the token (missing, unknown, revoked or expired)",
            403: "this token cannot open a relay stream (a client token can)",
            426: "the control plane speaks another protocol version: upgrade the older side",
        }.get(status, f"the control plane refused the relay connection (HTTP {status})")
    return _BY_STATUS.get(status, ApiError)(message, code=code, status=status, body=body)


def closed_error(fields: dict) -> ApiError | ConnectionFailed:
    """The error a CLOSE with `error` stands for: the server's refusal (its status), else a lost stream."""
    closed = from_wire(Close, fields)
    message, status = str(closed.error), closed.status
    if isinstance(status, int) and 400 <= status < 600 and closed.code:
        return _BY_STATUS.get(status, ApiError)(message, code=str(closed.code), status=status, body=fields)
    return ConnectionFailed(f"the exec stream ended: {message}")


def exit_code(fields: dict) -> int:
    """The remote command's exit code a CLOSE brings; the error it stands for (closed_error) when it brings none."""
    closed = from_wire(Close, fields)
    if is_int(closed.exit_code):
        return closed.exit_code
    raise closed_error(fields if closed.error else {"error": "closed without an exit code"})


def run_exec(
    client: RelayClient,
    job_id: int,
    argv: list[str],
    *,
    index: int | None = None,
    stdin: IO[bytes] | bytes | None = None,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None],
    on_open: Callable[[Stream], None] | None = None,
) -> int:
    """Run `argv` in the job's task and return its exit code; output goes to the callbacks as it comes.

    Raises ApiError (a refusal) or ConnectionFailed (the relay, the control plane or the agent went away).
    """
    link, stream = open_exec(client, job_id, argv, index)
    if on_open is not None:
        on_open(stream)
    feeder = threading.Thread(target=_feed, args=(stream, stdin), daemon=True, name="exec-stdin")
    feeder.start()
    try:
        while True:
            frame = stream.recv()
            if frame is None:
                continue
            if frame.type in (DATA, EXT_DATA):
                (on_stderr if frame.type == EXT_DATA and frame.channel == STDERR else on_stdout)(frame.data)
                stream.consumed(len(frame.data))
            elif frame.type == CLOSE:
                return exit_code(frame.fields)
    finally:
        link.close()


def _feed(stream: Stream, stdin: IO[bytes] | bytes | None) -> None:
    """stdin into the stream, then EOF (none given: EOF at once)."""
    if isinstance(stdin, bytes):
        if stdin and not stream.write(stdin):
            return
    elif stdin is not None:
        read = getattr(stdin, "read1", stdin.read)
        while True:
            try:
                chunk = read(STDIN_CHUNK)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            if not stream.write(chunk):
                return
    if stream.ended is None:
        stream.eof()


def exec_capture(
    client: RelayClient, job_id: int, argv: list[str], *, index: int | None = None, input: bytes | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """`Job.exec`: run `argv` in the task, its output captured (subprocess.CompletedProcess)."""
    out: list[bytes] = []
    err: list[bytes] = []
    code = run_exec(client, job_id, argv, index=index, stdin=input, on_stdout=out.append, on_stderr=err.append)
    done = subprocess.CompletedProcess(list(argv), code, b"".join(out), b"".join(err))
    if check:
        done.check_returncode()
    return done


__all__ = ["run_exec", "exec_capture", "open_exec", "open_stream", "closed_error", "exit_code"]
