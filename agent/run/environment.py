"""The environment a task runs with: the worker's, minus credentials, plus the task's."""

import os
from typing import Mapping

from gpulayer.protocol.assignment import Assignment

#: A variable whose upper-cased name contains one of these never reaches a task
#: from the worker's environment (the job's own env and secrets still do).
CREDENTIAL_MARKERS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "API_KEY",
    "APIKEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
)

#: Exact names that are credentials without saying so.
CREDENTIAL_NAMES = frozenset(
    {
        "GPULAYER_JOIN_TOKEN",
        "GPULAYER_TOKEN",
        "SSH_AUTH_SOCK",
        "PGPASS",
        "NETRC",
    }
)


def is_credential(name: str) -> bool:
    """True when a variable's name looks like it holds a credential."""
    upper = name.upper()
    return upper in CREDENTIAL_NAMES or any(marker in upper for marker in CREDENTIAL_MARKERS)


def filtered_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker's environment without credential-like variables."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if not is_credential(name)}


def cuda_visible_devices(gpus: list[int], device_ids: list[str]) -> str:
    """The CUDA_VISIBLE_DEVICES value for the task's reserved GPU indices.

    ``gpus`` are the worker-local indices the control plane reserved;
    ``device_ids`` maps them to the ids this worker itself sees (its own
    CUDA_VISIBLE_DEVICES, e.g. under Slurm). No GPUs gives the empty string,
    which hides every device from CUDA.
    """
    ids = [device_ids[i] if 0 <= i < len(device_ids) else str(i) for i in gpus]
    return ",".join(ids)


def task_environment(
    base: Mapping[str, str],
    assignment: Assignment,
    workdir: str,
    device_ids: list[str],
    python: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build a task's environment.

    Order (later wins): the filtered worker environment, the job's ``env``
    (with its secrets), then what the agent owns: GPULAYER_* ids (and
    GPULAYER_ARRAY_INDEX / GPULAYER_ARRAY_SIZE for an array's element),
    CUDA_VISIBLE_DEVICES and ``extra`` (PORT, MASTER_ADDR, ...).
    """
    env = dict(base)
    if python:
        bin_dir = os.path.dirname(os.path.abspath(python))
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", os.defpath)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({str(k): str(v) for k, v in assignment.env.items()})
    env.update(
        {
            "GPULAYER_JOB_ID": str(assignment.job_id),
            "GPULAYER_TASK_ID": str(assignment.task_id),
            "GPULAYER_ATTEMPT": str(assignment.attempt),
            "GPULAYER_TASK_INDEX": str(assignment.index),
            "GPULAYER_OUTPUT_DIR": workdir,
            "CUDA_VISIBLE_DEVICES": cuda_visible_devices(list(assignment.gpus), device_ids),
        }
    )
    if assignment.array_size is not None:  # an element of a job array (older servers send neither)
        index = assignment.index if assignment.array_index is None else assignment.array_index
        env["GPULAYER_ARRAY_INDEX"] = str(index)
        env["GPULAYER_ARRAY_SIZE"] = str(assignment.array_size)
    env.update(extra or {})
    return env


def task_argv(command: list[str], python: str | None, weights: str | None) -> list[str]:
    """The argv to run: ``python``/``python3`` becomes ``--python``, ``{weights}`` the weights path."""
    argv = [str(arg) for arg in command]
    if weights is not None:
        argv = [arg.replace("{weights}", weights) for arg in argv]
    if python and argv and argv[0] in ("python", "python3"):
        argv[0] = python
    return argv
