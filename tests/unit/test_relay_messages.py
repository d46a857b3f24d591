"""The relay's control messages (gpulayer/protocol/control.py) put on the wire the very bytes the hand-built dicts
did, and read back what those dicts said: each message built both ways (the old dict, as the code wrote it
before the declarations, and the declared type's wire form) gives the same frame; a reader takes a hand-built
dict (or a partial one) without refusing it."""
from __future__ import annotations

import dataclasses

import pytest

from gpulayer.protocol.control import (
    CLIENT_OPENS,
    MESSAGES,
    Close,
    ExecOpen,
    Resize,
    Settings,
    ShellOpen,
    Signal,
    SshOpen,
    StreamOpen,
    TcpOpen,
)
from gpulayer.protocol.fields import from_wire, json_schema, to_wire
from gpulayer.protocol.relay import CLOSE, KINDS, OPEN, RESIZE, SETTINGS, SIGNAL, decode, encode
from gpulayer.server.relay import opens

ERROR = "task 7 is not running on this worker"


def same_frame(type_: int, old: dict, new: object) -> None:
    """The hand-built dict and the declared message give one frame, byte for byte, and read back alike."""
    wire = to_wire(new)
    assert encode(3, type_, wire) == encode(3, type_, old), (old, wire)
    assert from_wire(type(new), decode(encode(3, type_, old)).fields) == new


CLOSES = [  # (the hand-built dict, the declared CLOSE) as each sender builds it
    ({"error": ERROR}, Close(error=ERROR)),                                            # agent: exec, shell, ssh, tcp
    ({"exit_code": 127, "reason": "cannot run 'x'"}, Close(exit_code=127, reason="cannot run 'x'")),  # exec
    ({"exit_code": 0}, Close(exit_code=0)),                                            # exec, shell: the command's
    ({"exit_code": 130}, Close(exit_code=130)),
    ({"exit_code": 0, "reason": "the ssh connection ended"}, Close(exit_code=0, reason="the ssh connection ended")),
    ({"reason": "the command ended"}, Close(reason="the command ended")),              # the handlers' own inbox
    ({"reason": "the connection ended"}, Close(reason="the connection ended")),        # relaylink/pipe.py
    ({"error": "too many", "code": "too_many_frames", "status": 429},                  # relaylink/streams.py
     Close(error="too many", code="too_many_frames", status=429)),
    ({"reason": "gone"}, Close(reason="gone")),                                        # hub: to the agent, client
    ({"reason": "refused", "error": "refused", "code": "forbidden", "status": 403},     # hub: a refusal
     Close(reason="refused", error="refused", code="forbidden", status=403)),
    ({"reason": "x", "error": "", "code": "relay_closed", "status": 502},              # an empty error is sent
     Close(reason="x", error="", code="relay_closed", status=502)),
    ({"reason": "the ingress is done with it"}, Close(reason="the ingress is done with it")),
]


@pytest.mark.parametrize("old,new", CLOSES)
def test_every_close_is_the_bytes_it_was(old, new):
    same_frame(CLOSE, old, new)


def test_the_hub_s_close_to_a_client_as_it_built_it():
    """gpulayer/server/relay/hub.py `_end` built `fields` by hand: `reason`, then with an error `error`, `code`
    (default relay_closed) and `status` (default 502)."""
    for error, code, status in [(None, None, None), ("no", None, None), ("no", "bad_frame", 400), ("", None, 500)]:
        fields: dict = {"reason": "why"}
        if error is not None:
            fields["error"] = error
            fields["code"], fields["status"] = code or "relay_closed", status or 502
        message = Close(reason="why") if error is None else Close(
            reason="why", error=error, code=code or "relay_closed", status=status or 502)
        same_frame(CLOSE, fields, message)


def test_signal_resize_settings_are_the_bytes_they_were():
    same_frame(SIGNAL, {"signal": "INT"}, Signal(signal="INT"))
    same_frame(RESIZE, {"rows": 40, "cols": 120}, Resize(rows=40, cols=120))
    same_frame(SETTINGS, {"max_data": 262144}, Settings(max_data=262144))


def test_a_client_s_opens_are_the_bytes_they_were():
    same_frame(OPEN, {"kind": "exec", "argv": ["echo", "hi"]}, ExecOpen(argv=["echo", "hi"]))
    same_frame(OPEN, {"kind": "tcp", "port": 8888}, TcpOpen(port=8888))
    same_frame(OPEN, {"kind": "ssh"}, SshOpen())
    for argv, term in [(None, None), (["top"], None), (None, "xterm"), (["top"], "vt100"), ([], "")]:
        fields: dict = {"kind": "shell", "rows": 24, "cols": 80}  # gpulayer/client/relay_shell.py, as it was
        if argv:
            fields["argv"] = list(argv)
        if term:
            fields["term"] = term
        same_frame(OPEN, fields, ShellOpen(rows=24, cols=80, argv=list(argv) if argv else None, term=term or None))


OPENED = [  # (kind, the client's OPEN, the checked detail's extra: the hub's _secret and max_data)
    ("exec", {"kind": "exec", "argv": ["python3", "-c", "print(1)"]}, {}),
    ("exec", {"kind": "exec", "argv": ["true"]}, {"max_data": 262144}),
    ("shell", {"kind": "shell", "rows": 24, "cols": 80}, {}),
    ("shell", {"kind": "shell", "rows": 24, "cols": 80, "argv": ["bash"], "term": "xterm-256color"}, {"max_data": 131072}),
    ("tcp", {"kind": "tcp", "port": 8888}, {}),
    ("tcp", {"kind": "tcp", "port": 22, "host": "::1"}, {}),
    ("tcp", {"kind": "tcp", "port": 22, "host": "localhost"}, {}),
    ("ssh", {"kind": "ssh"}, {"host_key": "-----BEGIN OPENSSH PRIVATE KEY-----\n...", "host_cert": "ssh-ed25519-cert-v01@openssh.com AAAA"}),
    ("ssh", {"kind": "ssh"}, {"host_key": "k", "host_cert": "c", "max_data": 262144}),
]


@pytest.mark.parametrize("kind,fields,extra", OPENED)
def test_the_control_plane_s_open_to_the_agent_is_the_bytes_it_was(kind, fields, extra):
    """gpulayer/server/relay/hub.py `_connect` and `_attach`: the checked detail, the secret and max_data after the
    job, task, index and session, in the order the hand-built dict had them."""
    detail = opens.detail(kind, fields)
    opening = {"session_id": 41, **detail, **extra}
    old = {"kind": kind, "job_id": 7, "task_id": 12, "index": 0, **opening}
    same_frame(OPEN, old, StreamOpen(kind=kind, job_id=7, task_id=12, index=0, **opening))


def test_the_ingress_s_open_is_the_bytes_it_was():
    """server/relay/ingress.py opens `tcp` streams with no session: kind, job, task, index, port."""
    old = {"kind": "tcp", "job_id": 7, "task_id": 12, "index": 3, "port": 8000}
    same_frame(OPEN, old, StreamOpen(kind="tcp", job_id=7, task_id=12, index=3, port=8000))


def test_readers_refuse_nothing_for_a_missing_field():
    """Each reader checks the values it uses, as it did reading the dicts: a message without them reads as nulls."""
    for cls in MESSAGES.values():
        empty = from_wire(cls, {})
        assert all(getattr(empty, f.name) == f.default for f in dataclasses.fields(cls))
    assert from_wire(StreamOpen, {"kind": 5, "newer": True}).kind == 5  # a newer peer's field is left out
    assert from_wire(Close, {"error": "x", "reason": "y"}).why() == "x"
    assert from_wire(Close, {"reason": "y"}).why() == "y"


def test_every_kind_has_its_declared_open_and_schemas_are_made():
    assert set(CLIENT_OPENS) == set(KINDS)
    for cls in MESSAGES.values():
        assert json_schema(cls)["type"] == "object"
    assert json_schema(Signal)["required"] == ["signal"]
    assert json_schema(StreamOpen)["required"] == ["kind", "job_id", "task_id", "index"]
