"""What both sides of the wire agree on: the protocol version and the defaults named once.

Imports nothing of gpulayer, so the client, the CLI, the control plane,
`gpulayer.testing` and the agent can all take their defaults from here
(protocol-v1.md, "Defaults"). Beside it, the wire objects declared once:
jobspec.py (the JobSpec), assignment.py (the Assignment), the worker's requests
(registration.py, heartbeat.py, finish.py), the relay's control messages
(control.py), and fields.py, which reads a
declaration (docs/architecture.md, "Adding a field").
"""
from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

PROTOCOL = 1
PROTOCOL_HEADER = "X-GpuLayer-Protocol"

# Defaults named once (protocol-v1.md, "Defaults").
HEARTBEAT_INTERVAL_S = 2.0
LEASE_TTL_S = 20.0
MAX_HEARTBEATS_PER_S = 500.0     # past it the interval and TTL grow with the fleet (server/runtime/cadence.py)
HEARTBEAT_JITTER = 0.2           # each answer's interval is 1 to 1.2 times the fleet's
DEFAULT_PORT = 8470
MAX_JSON_BODY = 1024 * 1024
MAX_ACQUIRE_WAIT_S = 30.0
START_TIMEOUT_S = 120.0          # a gang with a rank not started by then goes back to the queue whole
RENDEZVOUS_TIMEOUT_S = 300.0     # a gang whose ranks do not all arrive by then fails the attempt
ARTIFACT_RETENTION_S = 7 * 86400
UNNAMED_RETENTION_S = 86400  # an upload no job has named is swept after this (`--unnamed-retention`)
UPLOAD_QUOTA_BYTES = 10 * 1024 ** 3  # a user's uploads no job names yet, at most (`--upload-quota-mb`)
PROJECT_UPLOAD_QUOTA_BYTES = 50 * 1024 ** 3  # a project's (`--project-upload-quota-mb`)
ARTIFACT_SWEEP_INTERVAL_S = 3600.0
LOG_RETENTION_S = 14 * 86400     # log lines of a job that ended this long ago are pruned
JOB_RETENTION_S = 30 * 86400     # ended jobs (tasks, events, lines), loose events, departed workers
GPU_SAMPLE_RETENTION_S = 7 * 86400  # GPU utilization and memory samples (gpu_samples) older than this
PRUNE_INTERVAL_S = 300.0         # upkeep prunes this often, in small batches
SERVICE_MAX_ATTEMPTS = 10
MAX_OUTPUT_BYTES = 10 * 1024 ** 3  # a task output a worker uploads; clients' uploads have the store's limit
FAIRSHARE_HALF_LIFE_S = 7 * 86400.0  # fair share forgets half a project's usage in this long
# Backfill (docs/scheduling-time.md): reservations per group of workers, waiting jobs a plan looks at (Slurm's
# bf_max_job_test), the run time expected of a job with no time limit and no history; and their bounds.
BACKFILL_DEPTH = 1
BACKFILL_MAX_JOBS = 100
DEFAULT_RUNTIME_S = 3600.0
MAX_BACKFILL_DEPTH = 100
MAX_BACKFILL_MAX_JOBS = 100000
PREEMPT_GRACE_S = 30.0           # a preempted task's SIGTERM-to-SIGKILL grace
DEFAULT_GRACE_S = 30.0           # a job with --signal and no --grace: its stop signal-to-SIGKILL grace
MAX_GRACE_S = 600.0              # the server's --max-grace: the most a job's --grace may ask for
SIGNAL_DEFAULT_BEFORE_S = 60     # Slurm's: `--signal USR1` alone is sent 60 s before the time limit
# Elements (tasks) of one user's jobs not yet ended, at most (0: no cap); 10 arrays of MAX_ARRAY.
MAX_QUEUED_ELEMENTS = 1_000_000
PRIORITY_CLASSES = {"low": -10, "normal": 0, "high": 10}  # names `--priority` takes besides numbers
MAX_ARRAY = 100_000       # elements of one job array (one request, one transaction)
MAX_ARRAY_INDEX = 9_999_999
# ASCII digits only (\d and str.isdigit take "٣" and "²"), and few enough that int() takes them
ARRAY_RANGE = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,19})(?::([0-9]{1,19}))?)?\Z")
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "lost", "waiting")  # what GET /v1/jobs?state= takes
#: What every duration option and field takes (parse_duration), as its errors say.
DURATION_FORMS = ("seconds (90), 45s, 30m, 12h, 365d, 2w, or Slurm's MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                  "D-HH:MM:SS (a plain number is seconds, not Slurm's minutes)")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_NUMBER = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*([smhdw]?)")
# Slurm's --time forms: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (a bare MM is our seconds, above).
_DURATION_SLURM = re.compile(r"(?:([0-9]{1,6})-([0-9]{1,2})(?::([0-9]{1,2})(?::([0-9]{1,2}))?)?"
                             r"|(?:([0-9]{1,9}):)?([0-9]{1,9}):([0-9]{1,2}))")


def default_home() -> Path:
    """$GPULAYER_HOME, else ~/.gpulayer."""
    return Path(os.environ.get("GPULAYER_HOME") or Path.home() / ".gpulayer").expanduser()


def array_text(indices: list[int]) -> str:
    """Ascending indices written as ranges, as an array's `indices` are: [0, 1, 2, 5] -> "0-2,5"."""
    parts, start = [], 0
    for i in range(1, len(indices) + 1):
        if i == len(indices) or indices[i] != indices[i - 1] + 1:
            first, last = indices[start], indices[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def array_ranges(text: str) -> list[int]:
    """The indices that "0-999", "1,5,9-12" or "0-15:4" (a step) name, in the order written.

    Raises ValueError, saying what is wrong, for a malformed part, a range that goes down, an index
    past MAX_ARRAY_INDEX or more than MAX_ARRAY indices (the server checks repeats).
    """
    found: list[int] = []
    for part in text.replace(" ", "").split(","):
        match = ARRAY_RANGE.fullmatch(part)
        if not match:
            raise ValueError(f"{part!r} is not an index, a range A-B or a range with a step A-B:S "
                             "(e.g. 0-999, 1,5,9-12 or 0-15:4)")
        first, last, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
        if last < first or step < 1:
            raise ValueError(f"{part!r}: a range goes up (A <= B) in steps of at least 1")
        if last > MAX_ARRAY_INDEX:
            raise ValueError(f"indices go from 0 to {MAX_ARRAY_INDEX}, not {last}")
        if len(found) + (last - first) // step + 1 > MAX_ARRAY:
            raise ValueError(f"at most {MAX_ARRAY} elements")
        found.extend(range(first, last + 1, step))
    return found


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration as every option and field takes it: a number of seconds (90, 1.5), a
    number with a unit (45s, 30m, 12h, 365d, 2w) or Slurm's MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.

    Raises ValueError naming the accepted forms (DURATION_FORMS); the caller names its option or field,
    and checks its own bounds (0 is a duration).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text >= 0 and text != float("inf"):
            return float(text)
        raise ValueError(f"{text!r} is not a duration: write it as {DURATION_FORMS}")
    found = _DURATION_NUMBER.fullmatch(str(text).strip())
    if found:
        return float(found[1]) * _DURATION_UNITS[found[2]]
    slurm = _DURATION_SLURM.fullmatch(str(text).strip())
    if slurm:
        days, day_hours, day_minutes, day_seconds, hours, minutes, seconds = (int(g or 0) for g in slurm.groups())
        if slurm[1] is not None:  # D-HH[:MM[:SS]]
            hours, minutes, seconds = day_hours, day_minutes, day_seconds
            if hours < 24 and minutes < 60 and seconds < 60:
                return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
        elif seconds < 60 and (slurm[5] is None or minutes < 60):  # [HH:]MM:SS
            return float((hours * 60 + minutes) * 60 + seconds)
    raise ValueError(f"{str(text)!r} is not a duration: write it as {DURATION_FORMS}")


#: What `--signal` (JobSpec `signal`) takes, as its errors say.
SIGNAL_FORMS = ("[B:]SIG[@SECONDS]: a signal name or number (USR1, SIGUSR1, 10) and the whole seconds before the time "
                "limit it is sent (default 60); B: sends it to the command's top process only")
_SIGNAL = re.compile(r"([Bb]:)?([A-Za-z0-9]{1,16})(?:@([0-9]{1,9}))?\Z")
#: Signals a job may name (a stop's or a warning's): those a program can catch, and TERM/INT/HUP's kind.
_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "USR1": 10, "USR2": 12, "ALRM": 14, "TERM": 15, "CONT": 18,
            "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "PWR": 30}


def parse_signal(text: str) -> tuple[bool, str, int]:
    """Slurm's `--signal [B:]SIG[@SECONDS]`: (to the top process only, the signal's name without SIG,
    seconds before the time limit). Raises ValueError saying what is wrong (SIGNAL_FORMS)."""
    found = _SIGNAL.fullmatch(str(text).strip())
    if not found:
        raise ValueError(f"{text!r} is not a signal: write it as {SIGNAL_FORMS}")
    name = found[2].upper()
    name = name[3:] if name.startswith("SIG") else name
    if name.isdigit():
        name = next((k for k, v in _SIGNALS.items() if v == int(name)), name)
    if name not in _SIGNALS:
        raise ValueError(f"{found[2]!r} is no signal a job may name (one of {', '.join(sorted(_SIGNALS))}, "
                         "with or without SIG, or its number)")
    return found[1] is not None, name, int(found[3]) if found[3] is not None else SIGNAL_DEFAULT_BEFORE_S


def signal_number(name: str) -> int:
    """The number of a signal parse_signal named (USR1 -> 10)."""
    return _SIGNALS[name]


#: What Slurm's `--time` takes for no limit at all (any case).
UNLIMITED_TIMES = ("unlimited", "infinite")


def parse_time_limit(text: str | float | int) -> float:
    """Slurm's `--time`: as parse_duration, except that a bare number is minutes, with a fraction or not
    (`--time 90`: 90 minutes, `--time 1.5`: 90 seconds), as sbatch reads it; 30m, 2h and 1:00:00 alike.
    Raises ValueError (the caller reads UNLIMITED_TIMES first)."""
    if isinstance(text, str) and re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9})?", text.strip()):
        return float(text.strip()) * 60
    return parse_duration(text)


def parse_begin(text: str, now: float) -> float:
    """`--begin TIME` as a Unix time: `now`, `now+DURATION` (now+1h, now+90m, now+3600), or an ISO time
    (2026-12-24T18:00, 2026-12-24 18:00:00+01:00; UTC unless it names a zone). Raises ValueError for
    another form, and for a time more than a minute past."""
    text = str(text).strip()
    relative = re.fullmatch(r"now(?:\s*\+\s*(.+))?", text)
    if relative:
        return now + (parse_duration(relative[1]) if relative[1] else 0.0)
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: write an ISO time (2026-12-24T18:00, UTC unless it names a "
                         "zone) or now+DURATION (now+1h, now+90m)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.timezone.utc)
    seconds = at.timestamp()
    if seconds < now - 60:
        raise ValueError(f"{text!r} is in the past: a job begins now or later")
    return seconds


def plural(count: float, noun: str, nouns: str | None = None) -> str:
    """The count and the noun in the number it takes: "1 GPU", "2 GPUs", "0.5 CPUs", "1 job", "3 entries"
    (`nouns`: a plural that is not noun + "s")."""
    number = f"{int(count)}" if float(count).is_integer() else f"{count:g}"
    return f"{number} {noun if count == 1 else (nouns or noun + 's')}"
