"""Slurm provisioning: grow the fleet by submitting Slurm jobs that run `gpulayer worker start`.

`load(path)` reads and validates `$GPULAYER_HOME/provisioners.json` (raises
ConfigError naming the bad field). `Provisioning(provisioners, deps)`, over
its own `ProvisioningDeps` (built by server/process.py, nothing of HTTP), runs a
loop in its own thread (Slurm's tools may sit behind ssh and take seconds,
which the lease-expiry upkeep must not wait for). Each round it:

1. marks `attached` the open requests whose token a worker registered with;
2. fails the ones whose Slurm job ended without attaching, and cancels
   (`scancel`) the ones older than `provision_timeout_s`;
3. for each profile without an open request, when queued tasks fit the
   profile and no online worker with room can take them (the
   `provision_demand` query), mints a join token for one worker and submits
   one batch script.

`stop()` cancels every open request. docs/operations.md, "Slurm provisioning".
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.errors import ConfigError
from gpulayer.server.provisioning.slurm import ENDED, Slurm, SlurmError
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security import auth
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import row, rows

log = logging.getLogger("gpulayer.server.provisioning.loop")

TOKEN_TTL_S = 24 * 3600.0        # a provisioned worker's join token
MAX_IDLE_S = 300.0
PROVISION_TIMEOUT_S = 900.0
RETRY_AFTER_S = 60.0             # after a failed or cancelled request, before the profile asks again
LOOP_INTERVAL_S = 1.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: `$` would let a trailing newline through
_URL = re.compile(r"https?://[^/\s]+(?:/\S*)?")   # fullmatch: no space or newline anywhere


@dataclass(frozen=True)
class Profile:
    """One kind of worker a provisioner can ask Slurm for."""

    name: str
    cpus: float = 0
    gpus: int = 0
    ram_mb: int = 0
    labels: dict = field(default_factory=dict)
    sbatch: tuple = ()
    prerun: tuple = ()
    parallel: int = 1


@dataclass(frozen=True)
class Provisioner:
    """One Slurm cluster, reached locally (`login` empty) or over ssh."""

    name: str
    control_plane_url: str
    profiles: tuple
    login: str = ""
    ssh_key: str = ""
    max_idle_s: float = MAX_IDLE_S
    provision_timeout_s: float = PROVISION_TIMEOUT_S
    retry_after_s: float = RETRY_AFTER_S
    ca_file: str = ""
    output: str = ""


# -- configuration -------------------------------------------------------------

def _bad(path: str, message: str):
    return ConfigError(f"{path}: {message}")


def _fields(obj, path: str, known: dict, required: tuple) -> dict:
    if not isinstance(obj, dict):
        raise _bad(path, "must be an object")
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise _bad(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    for name in required:
        if name not in obj:
            raise _bad(f"{path}.{name}", "is required")
    out = {}
    for name, check in known.items():
        if name in obj:
            out[name] = check(obj[name], f"{path}.{name}")
    return out


def _name(value, path):
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _bad(path, "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return value


def _text(value, path):
    if not isinstance(value, str):
        raise _bad(path, "must be a string")
    return value


def _seconds(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise _bad(path, "must be a non-negative number of seconds (0 disables)")
    return float(value)


def _number(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise _bad(path, "must be a non-negative number")
    return value


def _count(value, path):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, "must be a non-negative integer")
    return value


def _positive(value, path):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(path, "must be a positive integer")
    return value


def _labels(value, path):
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                              for k, v in value.items()):
        raise _bad(path, 'must be an object of non-empty string keys to string values, e.g. {"gpu": "h100"}')
    return dict(value)


def _lines(value, path):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(path, "must be a list of strings")
    for i, line in enumerate(value):
        if "\n" in line or "\r" in line:
            raise _bad(f"{path}[{i}]", "must be one line")
    return tuple(value)


def _url(value, path):
    if not isinstance(value, str) or not _URL.fullmatch(value):
        raise _bad(path, "must be the http:// or https:// URL that compute nodes reach the control plane at")
    return value.rstrip("/")


PROFILE_FIELDS = {"name": _name, "cpus": _number, "gpus": _count, "ram_mb": _count, "labels": _labels,
                  "sbatch": _lines, "prerun": _lines, "parallel": _positive}
PROVISIONER_FIELDS = {"type": _text, "name": _name, "login": _text, "ssh_key": _text,
                      "control_plane_url": _url, "max_idle_s": _seconds, "provision_timeout_s": _seconds,
                      "retry_after_s": _seconds, "ca_file": _text, "output": _text, "profiles": lambda v, p: v}


def _profiles(value, path: str) -> tuple:
    if not isinstance(value, list) or not value:
        raise _bad(path, "must be a non-empty list of profiles")
    out, seen = [], set()
    for i, raw in enumerate(value):
        fields = _fields(raw, f"{path}[{i}]", PROFILE_FIELDS, ("name",))
        if fields["name"] in seen:
            raise _bad(f"{path}[{i}].name", f"duplicate profile name {fields['name']!r}")
        seen.add(fields["name"])
        out.append(Profile(**fields))
    return tuple(out)


def parse(data) -> list[Provisioner]:
    """Validate the decoded provisioners.json (a list, or {"provisioners": [...]}); raises ConfigError."""
    if isinstance(data, dict) and set(data) == {"provisioners"}:
        data = data["provisioners"]
    if not isinstance(data, list):
        raise _bad("provisioners", "must be a list of provisioners")
    out, seen = [], set()
    for i, raw in enumerate(data):
        path = f"provisioners[{i}]"
        fields = _fields(raw, path, PROVISIONER_FIELDS, ("name", "control_plane_url", "profiles"))
        if fields.pop("type", "slurm") != "slurm":
            raise _bad(f"{path}.type", 'must be "slurm" (the only kind there is)')
        if fields["name"] in seen:
            raise _bad(f"{path}.name", f"duplicate provisioner name {fields['name']!r}")
        seen.add(fields["name"])
        if fields.get("ssh_key") and not fields.get("login"):
            raise _bad(f"{path}.ssh_key", "is only used with login (user@host); login is empty")
        if fields.get("ssh_key") and not Path(fields["ssh_key"]).expanduser().is_file():
            raise _bad(f"{path}.ssh_key", f"no such file: {fields['ssh_key']}")
        if fields.get("login", "").startswith("-"):
            raise _bad(f"{path}.login", "must be user@host, not an option")
        fields["profiles"] = _profiles(fields["profiles"], f"{path}.profiles")
        out.append(Provisioner(**fields))
    return out


def load(path: Path) -> list[Provisioner]:
    """The provisioners of `path`; [] when the file does not exist. Raises ConfigError naming the bad field."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable JSON: {exc}") from None
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}") from None


def describe(provisioners: list[Provisioner]) -> list[dict]:
    """The configuration as /v1/provisioners shows it (no prerun lines, which may hold secrets)."""
    return [{"name": p.name, "login": p.login, "control_plane_url": p.control_plane_url,
             "max_idle_s": p.max_idle_s, "provision_timeout_s": p.provision_timeout_s,
             "retry_after_s": p.retry_after_s,
             "profiles": [{"name": f.name, "cpus": f.cpus, "gpus": f.gpus, "ram_mb": f.ram_mb,
                           "labels": f.labels, "parallel": f.parallel, "sbatch": list(f.sbatch)}
                          for f in p.profiles]} for p in provisioners]


def requests_listing(conn: apsw.Connection, limit: int = 100, before: int | None = None) -> list[dict]:
    """Recent provision requests, newest first: before the id `before` (None: the newest), at most `limit`."""
    return rows(conn, "list_provision_requests", limit=limit, before=before)


# -- the batch job -------------------------------------------------------------

def worker_name(prov: Provisioner, profile: Profile, request_id: int) -> str:
    return f"{prov.name}-{profile.name}-{request_id}"


def output_path(prov: Provisioner, scripts: Path) -> str:
    """Where the job's stdout/stderr go, as a Slurm pattern (%j: the job id)."""
    if prov.output:
        return prov.output
    return str(scripts / "slurm-%j.out") if not prov.login else "gpulayer-%j.out"


def sbatch_args(prov: Provisioner, profile: Profile, scripts: Path) -> list[str]:
    """The profile's resources as sbatch options, then its own `sbatch` lines (which win)."""
    args = [f"--job-name=gpulayer-{prov.name}-{profile.name}", f"--output={output_path(prov, scripts)}",
            "--export=NONE", "--nodes=1", "--ntasks=1"]
    if profile.cpus:
        args.append(f"--cpus-per-task={math.ceil(profile.cpus)}")
    if profile.ram_mb:
        args.append(f"--mem={profile.ram_mb}M")
    if profile.gpus:
        args.append(f"--gres=gpu:{profile.gpus}")
    return [*args, *profile.sbatch]


def batch_script(prov: Provisioner, profile: Profile, request_id: int, token: str) -> str:
    """The job: `prerun` lines, then exec the worker agent with this request's join token."""
    name = worker_name(prov, profile, request_id)
    worker = ["gpulayer", "--url", prov.control_plane_url]
    if prov.ca_file:
        worker += ["--ca-file", prov.ca_file]
    worker += ["worker", "start", "--name", name]
    for key, value in sorted(profile.labels.items()):
        worker += ["--label", f"{key}={value}"]
    worker += ["--parallel", str(profile.parallel), "--max-idle", f"{prov.max_idle_s:.3f}".rstrip("0").rstrip(".")]  # never 1e+06
    return "\n".join([
        "#!/bin/bash",
        f"# GPUlayer provision request {request_id}: provisioner {prov.name}, profile {profile.name}.",
        "# It installs nothing: the prerun lines prepare the environment that has `gpulayer`.",
        "set -e",
        "trap 'echo \"gpulayer provisioning: line $LINENO exited with status $?: $BASH_COMMAND\" >&2' ERR",
        *profile.prerun,
        f"export GPULAYER_JOIN_TOKEN={shlex.quote(token)}",
        f"exec {shlex.join(worker)} --state-dir \"${{TMPDIR:-/tmp}}/gpulayer-worker-${{SLURM_JOB_ID:-$$}}\"",
        "",
    ])


# -- the loop ------------------------------------------------------------------

def _shape(prov: Provisioner, profile_name: str) -> dict | None:
    """A profile's resources and labels as provision_demand's :covered takes them."""
    for f in prov.profiles:
        if f.name == profile_name:
            return {"cpus": f.cpus, "gpus": f.gpus, "memory_mb": f.ram_mb, "labels": f.labels}
    return None


@dataclass(frozen=True)
class ProvisioningDeps:
    """What the provisioning loop works with: the state file, the scheduler, token hashes, settings, the clock."""

    config: ControlPlaneConfig
    store: Store
    scheduler: Scheduler
    auth: auth.Authenticator
    clock: Callable[[], float]


class Provisioning:
    """The provisioning loop of one control plane (its own thread)."""

    def __init__(self, provisioners: list[Provisioner], deps: ProvisioningDeps, *, interval_s: float = LOOP_INTERVAL_S,
                 slurm_env: dict | None = None):
        self.provisioners = {p.name: p for p in provisioners}
        self.deps = deps
        self.interval_s = interval_s
        self.slurm = {p.name: Slurm(p.login, os.path.expanduser(p.ssh_key) if p.ssh_key else "", env=slurm_env)
                      for p in provisioners}
        self.scripts = deps.config.layout.home / "provisioner"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def store(self):
        return self.deps.store

    def now(self) -> float:
        return self.deps.clock()

    def start(self) -> None:
        """Close what an earlier run left half-done, then run the loop in a thread."""
        self.scripts.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.scripts, 0o700)
        for req in self.store.read(rows, "open_provision_requests"):
            if req["state"] == "requested":
                self._end(req, "failed", "the control plane stopped before sbatch answered")
            elif req["provisioner"] not in self.provisioners:
                self._end(req, "cancelled", f"provisioner {req['provisioner']!r} is no longer configured; "
                                            f"Slurm job {req['slurm_job_id']} was left as it is")
        self._thread = threading.Thread(target=self._run, name="gpulayer-provisioner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and cancel every open request (scancel); the store must still be open."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        for req in self.store.read(rows, "open_provision_requests"):
            if req["provisioner"] in self.provisioners:
                self._cancel(req, "the control plane shut down")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad round
                if self._stop.is_set():
                    return
                log.exception("provision_round_failed")

    def tick(self) -> None:
        """One round: attach, fail or time out open requests, then submit where there is demand."""
        for a in self.deps.scheduler.provision_attach(self.now()):
            log.info("provision_attached request=%s slurm_job=%s worker=%s", a["id"], a["slurm_job_id"],
                     a["worker_id"])
            self._forget_script(a["id"])
        self._watch_open()
        # A task that fits a profile already asked for (open request, or asked this round) asks no more:
        # profiles are tried in file order, so list the cheapest first.
        covered = [_shape(self.provisioners[r["provisioner"]], r["profile"])
                   for r in self.store.read(rows, "open_provision_requests") if r["provisioner"] in self.provisioners]
        for prov in self.provisioners.values():
            for profile in prov.profiles:
                if self._stop.is_set():
                    return
                if self._wants_worker(prov, profile, covered):
                    self._submit(prov, profile)
                    covered.append(_shape(prov, profile.name))

    def _watch_open(self) -> None:
        pending = [r for r in self.store.read(rows, "open_provision_requests")
                   if r["state"] == "pending" and r["provisioner"] in self.provisioners]
        for name in {r["provisioner"] for r in pending}:
            mine = [r for r in pending if r["provisioner"] == name]
            try:
                states = self.slurm[name].states([r["slurm_job_id"] for r in mine])
            except SlurmError as exc:
                for r in mine:
                    self.deps.scheduler.provision_note_error(r["id"], str(exc), self.now())
                states = None
            for r in mine:
                self._judge(self.provisioners[name], r, None if states is None else states.get(r["slurm_job_id"], "GONE"))

    def _judge(self, prov: Provisioner, req: dict, state: str | None) -> None:
        if state is not None and (state in ENDED or state == "GONE"):
            # It may have attached between the attach query and squeue: look once more.
            if self.deps.scheduler.provision_attach(self.now()):
                return
            tail = self.slurm[prov.name].tail(output_path(prov, self.scripts).replace("%j", req["slurm_job_id"]))
            error = (f"Slurm job {req['slurm_job_id']} ended ({state if state != 'GONE' else 'no longer listed'}) "
                     "before its worker attached")
            self._end(req, "failed", error + (f"; its output ends with:\n{tail}" if tail else ""))
            return
        timeout = prov.provision_timeout_s
        if timeout and self.now() - req["created_at"] >= timeout:
            self._cancel(req, f"its worker did not attach within provision_timeout_s ({timeout:g} s); "
                              f"Slurm job {req['slurm_job_id']} was {state or 'in an unknown state'}")

    def _wants_worker(self, prov: Provisioner, profile: Profile, covered: list[dict | None]) -> bool:
        last = self.store.read(row, "last_provision_request", provisioner=prov.name, profile=profile.name)
        if last is not None:
            if last["state"] in ("requested", "pending"):
                return False
            if last["state"] in ("failed", "cancelled") and self.now() - last["updated_at"] < prov.retry_after_s:
                return False
        demand = self.store.read(row, "provision_demand", cpus=profile.cpus, gpus=profile.gpus,
                                 memory_mb=profile.ram_mb, labels=json.dumps(profile.labels),
                                 covered=json.dumps([c for c in covered if c is not None]))
        return demand["tasks"] > 0

    def _submit(self, prov: Provisioner, profile: Profile) -> None:
        secret, jti = auth.new_token("join"), auth.new_jti()
        now = self.now()
        req = self.deps.scheduler.provision_open(
            prov.name, profile.name, lambda request_id: worker_name(prov, profile, request_id), profile.labels,
            token_hash=self.deps.auth.hash(secret), jti=jti, expires_at=now + TOKEN_TTL_S, now=now)
        log.info("provision_requested request=%s provisioner=%s profile=%s", req["id"], prov.name, profile.name)
        script = batch_script(prov, profile, req["id"], secret)
        path = self.scripts / f"request-{req['id']}.sh"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(script)
        try:
            job_id = self.slurm[prov.name].submit(script, str(path), sbatch_args(prov, profile, self.scripts))
        except SlurmError as exc:
            self._end({"id": req["id"]}, "failed", str(exc))
            return
        self.deps.scheduler.provision_submitted(req["id"], job_id, self.now())
        log.info("provision_submitted request=%s slurm_job=%s", req["id"], job_id)

    def _cancel(self, req: dict, reason: str) -> None:
        error = reason
        if req.get("slurm_job_id"):
            try:
                self.slurm[req["provisioner"]].cancel(req["slurm_job_id"])
            except SlurmError as exc:
                error += f"; scancel failed: {exc}"
        self._end(req, "cancelled", error)

    def _end(self, req: dict, state: str, error: str) -> None:
        ended = self.deps.scheduler.provision_end(req["id"], state, error, self.now())
        if ended is not None:
            self.deps.auth.invalidate()
            self.deps.scheduler.wake()
            log.warning("provision_%s request=%s slurm_job=%s error=%s", state, req["id"], ended["slurm_job_id"],
                        json.dumps(error[-300:]))
        self._forget_script(req["id"])

    def _forget_script(self, request_id: int) -> None:
        """The script holds a live join token: remove it once Slurm has its copy and the request is settled."""
        (self.scripts / f"request-{request_id}.sh").unlink(missing_ok=True)
