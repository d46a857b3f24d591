"""JobSpecs kept in a TOML file, so a job can live in the repository it runs (`gpulayer submit -f job.toml`).

A job file holds `command` (a list, or a string split as a shell would) and
any setting `gl.job()` takes, with the same names; a `[service]` table (or
`service = true`) makes it a service, with `gl.service()`'s settings:

    command = ["python", "train.py"]
    gpus = 1
    source = "."            # paths are relative to the current directory, as on the command line
    outputs = ["out/"]
    retry = 3
    [env]
    EPOCHS = "10"

Settings are passed on unread, so one that `gl.job()` learns is one a job file
may hold; an unknown one is refused as `gl.job()` refuses it.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Iterable, Optional

from gpulayer.client import specs

SERVICE_SETTINGS = specs.SERVICE_SETTINGS  # `service()`'s settings


class ServiceOnly(ValueError):
    """Service settings given for a job that is no service: refused, never dropped (it would run once as
    a batch job, its replicas and restarts forgotten). `settings`: their names."""

    def __init__(self, settings: list[str]):
        super().__init__(f"{', '.join(settings)}: a service's settings, for a service only "
                         "(`service = true` or a [service] table)")
        self.settings = settings


def read_job_file(path: str | Path) -> dict:
    """The fields of a job file as a dict; ValueError naming the file when it is not TOML."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None


def spec_from_fields(fields: dict, command: Optional[str | Iterable[str]] = None, service: bool = False,
                     overrides: Optional[dict] = None, service_overrides: Optional[dict] = None) -> dict:
    """A JobSpec from a job file's fields; `command` and the overrides (None: not given) win over them.

    `service=True` makes it a service even when the fields have no `[service]`.
    Raises ValueError for a missing command or a bad field, TypeError for an unknown one.
    """
    fields = dict(fields)
    argv = command or fields.pop("command", None)
    fields.pop("command", None)
    block: Any = fields.pop("service", None)
    fields.update(_given(overrides))
    # an unknown key first: `comand = [...]` is a misspelt command, not a missing one
    specs.refuse_unknown("job", fields, ("command", *specs.JOB_SETTINGS))
    if not argv:
        raise ValueError("a job needs a command: `command = [...]` in the file, or one after `--`")
    if not isinstance(block, (dict, bool, type(None))):
        raise ValueError(f"service is a table ([service]) or true/false, not {block!r}")
    if not (service or isinstance(block, dict) or block is True):
        stray = sorted(_given(service_overrides))
        if stray:
            raise ServiceOnly(stray)
        return specs.job(argv, **fields)
    settings = dict(block) if isinstance(block, dict) else {}
    settings.update(_given(service_overrides))
    specs.refuse_unknown("service", settings, SERVICE_SETTINGS)
    return specs.service(argv, **settings, **fields)


def job_from_file(path: str | Path, command: Optional[str | Iterable[str]] = None, **overrides: Any) -> dict:
    """A JobSpec read from a TOML job file; `command` and keyword settings (not None) override its own.

    `gl.client.submit(gl.job_from_file("job.toml", gpus=2))`. Raises OSError when
    the file cannot be read, ValueError / TypeError as `gl.job()` does.
    """
    service_overrides = {k: overrides.pop(k) for k in SERVICE_SETTINGS if k in overrides}
    return spec_from_fields(read_job_file(path), command, overrides=overrides, service_overrides=service_overrides)


def _given(settings: Optional[dict]) -> dict:
    return {k: v for k, v in (settings or {}).items() if v is not None}
