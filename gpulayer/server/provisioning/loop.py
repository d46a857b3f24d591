"""Provisioning: grow the fleet with Slurm jobs, or Kubernetes Pods, that run `gpulayer worker start`.

`config.load(path)` reads `$GPULAYER_HOME/provisioners.json`. `Provisioning(provisioners, deps)`, over
its own `ProvisioningDeps` (built by server/process.py, nothing of HTTP), runs a
loop in its own thread (Slurm's tools may sit behind ssh and take seconds, and the
Kubernetes API answers over the network, which the lease-expiry upkeep must not wait for). Each round it:

1. marks `attached` the open requests whose token a worker registered with;
2. fails the ones whose Slurm job or Pod ended without attaching, and cancels
   (`scancel`, or deletes the Pod) the ones older than `provision_timeout_s`;
3. for each profile without an open request, when queued tasks fit the
   profile and no online worker with room can take them (the
   `provision_demand` query), mints a join token for one worker and submits
   one batch script, or creates one Pod and the Secret of its token (provisioning/kubernetes.py);
4. deletes the Pods whose worker has left (idle past `max_idle_s`) and their Secrets.

A request's `slurm_job_id` is the Slurm job id, or the Pod's name. `stop()` cancels every open request.
docs/operations.md, "Slurm provisioning"; docs/kubernetes.md, "The Kubernetes provisioner".
"""
from __future__ import annotations

import json
import logging
import math
import os
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import apsw

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.kube.api import KubeError
from gpulayer.server.provisioning import kubernetes
from gpulayer.server.provisioning.config import LOOP_INTERVAL_S, TOKEN_TTL_S, Profile, Provisioner
from gpulayer.server.provisioning.slurm import ENDED, Slurm, SlurmError
from gpulayer.server.scheduler.core import Scheduler
from gpulayer.server.security import auth
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import row, rows

log = logging.getLogger("gpulayer.server.provisioning.loop")
REAP_EVERY_S = 15.0   # how often the Pods of departed workers are looked for (two list calls per provisioner)


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
                      for p in provisioners if p.type == "slurm"}
        self.kube = {p.name: kubernetes.Kube(p) for p in provisioners if p.type == "kubernetes"}
        self._reaped_at = {name: -math.inf for name in self.kube}
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
                self._end(req, "failed", "the control plane stopped before "
                          + ("the Kubernetes API answered" if req["provisioner"] in self.kube else "sbatch answered"))
            elif req["provisioner"] not in self.provisioners:
                self._end(req, "cancelled", f"provisioner {req['provisioner']!r} is no longer configured; "
                                            f"{self._what(req)} was left as it is")
        self._thread = threading.Thread(target=self._run, name="gpulayer-provisioner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and cancel every open request (scancel, or delete the Pod); the store must still be open."""
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
        self._reap()

    def _reap(self) -> None:
        """Delete the Pods whose worker left (and stray Secrets) of each kubernetes provisioner, every
        min(REAP_EVERY_S, max_idle_s): a Pod outlives its worker by at most that."""
        due = [name for name, kube in self.kube.items()
               if self.now() - self._reaped_at[name] >= min(REAP_EVERY_S, kube.prov.max_idle_s or REAP_EVERY_S)]
        if not due:
            return
        open_pods = {r["slurm_job_id"] for r in self.store.read(rows, "open_provision_requests")}
        for name in due:
            kube = self.kube[name]
            self._reaped_at[name] = self.now()
            try:
                for pod in kube.reap(open_pods, self._closed):
                    log.info("provision_pod_deleted provisioner=%s pod=%s", name, pod)
            except KubeError as exc:
                log.warning("provision_reap_failed provisioner=%s error=%s", name, json.dumps(str(exc)[-300:]))

    def _closed(self, ids: list[int]) -> set[int]:
        """Of these request ids, the failed or cancelled ones."""
        return {r["id"] for r in self.store.read(rows, "closed_provision_requests", ids=json.dumps(ids))}

    def _watch_open(self) -> None:
        pending = [r for r in self.store.read(rows, "open_provision_requests")
                   if r["state"] == "pending" and r["provisioner"] in self.provisioners]
        for name in {r["provisioner"] for r in pending}:
            mine = [r for r in pending if r["provisioner"] == name]
            try:
                states = self._states(name, mine)
            except (SlurmError, KubeError) as exc:
                for r in mine:
                    self.deps.scheduler.provision_note_error(r["id"], str(exc), self.now())
                states = None
            for r in mine:
                self._judge(self.provisioners[name], r, None if states is None else states.get(r["slurm_job_id"], "GONE"))

    def _states(self, name: str, mine: list[dict]) -> dict[str, str]:
        """{slurm_job_id: state} of the open requests of provisioner `name` (a Pod's phase for Kubernetes);
        a Pod kept from running (an image that will not pull, no node fits) says why in the request's row."""
        if name not in self.kube:
            return self.slurm[name].states([r["slurm_job_id"] for r in mine])
        pods = self.kube[name].phases()
        states = {}
        for r in mine:
            if r["slurm_job_id"] in pods:
                states[r["slurm_job_id"]], stuck = kubernetes.describe_phase(pods[r["slurm_job_id"]])
                if stuck:
                    self.deps.scheduler.provision_note_error(r["id"], f"Pod {r['slurm_job_id']}: {stuck}", self.now())
        return states

    def _judge(self, prov: Provisioner, req: dict, state: str | None) -> None:
        ended = kubernetes.ENDED if prov.type == "kubernetes" else ENDED
        if state is not None and (state in ended or state == "GONE"):
            # It may have attached between the attach query and squeue: look once more.
            if self.deps.scheduler.provision_attach(self.now()):
                return
            if prov.type == "kubernetes":
                tail = self.kube[prov.name].tail(req["slurm_job_id"])
            else:
                tail = self.slurm[prov.name].tail(output_path(prov, self.scripts).replace("%j", req["slurm_job_id"]))
            error = (f"{self._what(req)} ended ({state if state != 'GONE' else 'no longer listed'}) "
                     "before its worker attached")
            self._end(req, "failed", error + (f"; its output ends with:\n{tail}" if tail else ""))
            return
        timeout = prov.provision_timeout_s
        if timeout and self.now() - req["created_at"] >= timeout:
            self._cancel(req, f"its worker did not attach within provision_timeout_s ({timeout:g} s); "
                              f"{self._what(req)} was {state or 'in an unknown state'}")

    def _what(self, req: dict) -> str:
        """How an error names a request's job: "Slurm job 123" or "Pod gpulayer-k8s-a100-4"."""
        kind = "Pod" if req["provisioner"] in self.kube else "Slurm job" if req["provisioner"] in self.slurm else "Slurm job or Pod"
        return f"{kind} {req.get('slurm_job_id')}"

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
        if prov.type == "kubernetes":
            self._create_pod(prov, profile, req, secret)
            return
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

    def _create_pod(self, prov: Provisioner, profile: Profile, req: dict, token: str) -> None:
        """The request's Secret and Pod; a refusal (401, 403, quota, 409, 422, no answer) fails the request."""
        pod = kubernetes.pod_manifest(prov, profile, req["id"], req["name"])
        try:
            name = self.kube[prov.name].create(pod, kubernetes.secret_manifest(prov, profile, req["id"], token))
        except KubeError as exc:
            self._end({"id": req["id"]}, "failed", str(exc))   # create() took back what it had made
            return
        self.deps.scheduler.provision_submitted(req["id"], name, self.now())
        log.info("provision_submitted request=%s pod=%s", req["id"], name)

    def _cancel(self, req: dict, reason: str) -> None:
        error = reason
        if req.get("slurm_job_id") and req["provisioner"] in self.slurm:
            try:
                self.slurm[req["provisioner"]].cancel(req["slurm_job_id"])
            except SlurmError as exc:
                error += f"; scancel failed: {exc}"
        self._end(req, "cancelled", error)

    def _end(self, req: dict, state: str, error: str) -> None:
        if req.get("provisioner") in self.kube:
            # Never a Pod left behind: a request that ends takes its Pod and Secret with it.
            name = req.get("slurm_job_id") or f"gpulayer-{req['provisioner']}-{req['profile']}-{req['id']}"
            try:
                self.kube[req["provisioner"]].delete(name)
            except KubeError as exc:
                error += f"; deleting Pod {name} failed (the next rounds try again): {exc}"
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
