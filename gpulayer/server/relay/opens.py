"""What a client's relay request may say: its URL's query (`kind`, `index`) and each OPEN's fields per kind
(declared in gpulayer/protocol/control.py, read through those declarations).

Each check raises InvalidRequest (400 `invalid_field`, naming the field); what passes is what the agent gets and
the session's row records as its `detail`.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs

from gpulayer.protocol.control import ExecOpen, ShellOpen
from gpulayer.protocol.fields import from_wire
from gpulayer.protocol.forward import DEFAULT_HOST, tcp_target
from gpulayer.protocol.relay import KINDS
from gpulayer.server.errors import InvalidRequest

MAX_ARGV_BYTES = 64 * 1024


def query(query_string: str) -> tuple[int | None, str]:
    """`index` and `kind` of a client's relay URL; InvalidRequest (400) for a bad one."""
    found = parse_qs(query_string or "", keep_blank_values=True)
    kind = (found.get("kind") or ["exec"])[-1]
    if kind not in KINDS:
        raise InvalidRequest(f"kind: unknown; expected {', '.join(KINDS)}", field="kind")
    given = found.get("index")
    if not given:
        return None, kind
    raw = given[-1]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise InvalidRequest("index: must be a whole number from 0", field="index")
    return int(raw), kind


def detail(kind: str, fields: dict) -> dict:
    """What a kind's OPEN carries besides kind, job and task (recorded as the session's `detail`)."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind: unknown; expected {', '.join(KINDS)}", field="kind")
    if kind == "shell":
        return shell_detail(fields)
    if kind == "tcp":  # a port in the task's network view (gpulayer/protocol/forward.py)
        try:
            host, port = tcp_target(fields)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="host" if str(exc).startswith("host") else "port") from None
        return {"port": port, **({"host": host} if host != DEFAULT_HOST else {})}
    if kind == "ssh":
        return {}  # the SSH protocol runs end to end inside the stream; its host key goes in the hub's _secret, unrecorded
    argv = from_wire(ExecOpen, fields).argv
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidRequest("argv: must be a non-empty list of strings (the command and its arguments)", field="argv")
    if sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv) > MAX_ARGV_BYTES:
        raise InvalidRequest(f"argv: over {MAX_ARGV_BYTES} bytes", field="argv")
    return {"argv": argv}


TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def shell_detail(fields: dict) -> dict:
    """A shell's OPEN: `rows` and `cols` (1 to 65535), `term` (a terminal type's name), `argv` when a command
    replaces the task's shell (checked as exec's)."""
    opened = from_wire(ShellOpen, fields)
    found: dict = {}
    for name in ("rows", "cols"):
        value = getattr(opened, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
            raise InvalidRequest(f"{name}: must be a whole number from 1 to 65535 (the terminal's size)", field=name)
        found[name] = value
    term = opened.term
    if term is not None:
        if not isinstance(term, str) or not TERM.fullmatch(term):
            raise InvalidRequest("term: must be a terminal type's name (letters, digits, . _ + -; at most 64)", field="term")
        found["term"] = term
    if opened.argv is not None:
        found["argv"] = detail("exec", fields)["argv"]
    return found
