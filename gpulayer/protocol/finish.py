"""A task's finish, declared once: `Finish` (one task), `FinishItem` and `FinishMany` (several in one request).

The agent builds these and sends their wire form (agent/run/reports.py, agent/run/chunks.py); the server reads
them through this declaration (gpulayer/server/http/wire.py); OpenAPI and the finish tables of
docs/protocol.md are generated from it (registration.py says how).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from gpulayer.protocol.fields import declare, json_schema
from gpulayer.protocol.jobspec import DIGEST_PATTERN

Outcome = Literal["succeeded", "failed", "cancelled", "timed_out"]
OUTCOMES: tuple[str, ...] = typing.get_args(Outcome)
Stream = Literal["stdout", "stderr", "system"]
STREAMS: tuple[str, ...] = typing.get_args(Stream)
SignalWhy = Literal["time_limit", "silence_timeout", "cancelled", "preempted", "drained", "requeued", "restart",
                    "gpu_memory"]  # gpu_memory: over its memory share of a time-sliced GPU (schema 32)
SIGNAL_WHYS: tuple[str, ...] = typing.get_args(SignalWhy)

MAX_FINISHES = 1024          # finishes in one finish-many request (and ids in `held`, `release`)
MAX_LOG_LINES = 10_000       # lines in one logs request or finish
MAX_LOG_TEXT = 64 * 1024     # a line's text is cut to this many characters
MAX_CHECKPOINT_FILES = 100_000
MAX_SIGNALS = 16


@dataclass(frozen=True, kw_only=True)
class LogLine:
    """One log line (`logs`' and a finish's `lines`)."""

    n: int | None = declare(None, minimum=0, maximum=1 << 62,
                            help="its number within the task's attempt, from 0 (null: after the task's last line)")
    stream: Stream = declare("stdout", help='"stdout", "stderr" or "system"')
    text: str = declare(help=f"the line (cut to {MAX_LOG_TEXT:,} characters)")
    at: float = declare(0, minimum=0, maximum=1e12, help="Unix seconds")


@dataclass(frozen=True, kw_only=True)
class SignalSent:
    """One signal the agent sent a task's process (a finish's `signals`), each a `task_signalled` event."""

    why: SignalWhy = declare(help="why it was sent")
    signal: str = declare(max_bytes=16, help='its name, e.g. "SIGUSR1"')
    at: float = declare(0, minimum=0, maximum=1e12, help="Unix seconds")


@dataclass(frozen=True, kw_only=True)
class CheckpointFile:
    """One file of a checkpoint's manifest (docs/training.md)."""

    CLOSED = True  # a key the server does not know is refused

    path: str = declare(max_bytes=1024, help="relative to the checkpoint directory, each once")
    digest: str = declare(pattern=DIGEST_PATTERN, help="its artifact")
    size: int = declare(minimum=0, maximum=1 << 50, help="bytes")
    mode: int = declare(0o644, minimum=0, maximum=0o7777, shows="0o644", help="permission bits")


@dataclass(frozen=True, kw_only=True)
class CheckpointUpload:
    """A finish's `checkpoint`: the task's checkpoint directory, uploaded when an attempt ends without success."""

    files: list[dict[str, Any]] = declare(of=CheckpointFile, max_items=MAX_CHECKPOINT_FILES,
                                          help="every regular file of `GPULAYER_CHECKPOINT_DIR`")


@dataclass(frozen=True, kw_only=True)
class Finished:
    """How a task's run ended: the fields of `Finish` and of each `FinishItem`."""

    exit_code: int | None = declare(None, minimum=-(1 << 31), maximum=1 << 31,
                                    help="its process's exit code (null: none, e.g. it never started)")
    outcome: Outcome = declare(help="how it ended")
    outputs: dict[str, str] = declare({}, help="{relative path: digest}; one whose artifact the worker neither "
                                               "uploaded nor may read through its tasks is left out, with an "
                                               "`outputs_refused` event")
    lines: list[dict[str, Any]] = declare([], of=LogLine, max_items=MAX_LOG_LINES,
                                          help="the task's last log lines, as in `logs`, stored in the same "
                                               "transaction")
    reason: str | None = declare(None, omit=True, max_bytes=2048, help="why, for people")
    signals: list[dict[str, Any]] = declare(
        [], omit=True, of=SignalSent, max_items=MAX_SIGNALS,
        help="what the agent sent the task's process (added with signals), whose `why` the control plane sets to "
             "`preempted` or `requeued` for a stop it asked for as such")
    pid: int | None = declare(None, omit=True, minimum=1, maximum=1 << 31,
                              help="the task's start, never sent (its process ended first), rides on this finish")
    checkpoint: CheckpointUpload | None = declare(
        None, omit=True, help="recorded in the finish's transaction while the task is still this worker's; one "
                              "naming a file not stored is left out, with a `checkpoint_incomplete` event (additive)")


@dataclass(frozen=True, kw_only=True)
class Finish(Finished):
    """POST /v1/worker/tasks/{id}/finish: one task's end, and optionally what to run next in its slot."""

    next: bool = declare(False, help="also acquire for the slot this frees: the answer's `task` (and `more`)")
    max_tasks: int | None = declare(None, omit=True, minimum=1, maximum=1024,
                                    help="with `next`: as in `acquire`")


@dataclass(frozen=True, kw_only=True)
class FinishItem(Finished):
    """One finish of `finish-many`, fenced by its attempt."""

    task_id: int = declare(minimum=1, maximum=1 << 62, help="which task")
    attempt: int = declare(minimum=1, maximum=1 << 31, help="its attempt: a finish for another is refused alone")
    run_s: float | None = declare(None, omit=True, minimum=0, maximum=1e9,
                                  help="seconds the task took on the worker (leases ahead are sized by it)")


@dataclass(frozen=True, kw_only=True)
class FinishMany:
    """POST /v1/worker/finish-many: several finishes in one transaction; unknown fields are refused."""

    finishes: list[FinishItem] = declare([], max_items=MAX_FINISHES, schema={"items": json_schema(FinishItem, closed=False)},
                                         help="the finishes, each task once (a field an item does not declare is "
                                              "left out)")
    prefetch: bool = declare(False, help="the worker takes elements leased ahead (`ahead`)")
    held: list[int] = declare([], max_items=MAX_FINISHES,
                              help="task ids the worker holds (queued, running, finishes not yet answered)")
    release: list[int] = declare([], omit=True, max_items=MAX_FINISHES,
                                 help="elements leased ahead the worker gives back (requeued, same attempt)")
    next: bool = declare(False, omit=True, help="also acquire: `task`, `more` as `acquire` with `wait_s` 0")
    max_tasks: int | None = declare(None, omit=True, minimum=1, maximum=1024, help="with `next`: as in `acquire`")
