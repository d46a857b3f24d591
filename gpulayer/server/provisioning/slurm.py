"""Slurm's command-line tools, run on this machine or on a login node over the system `ssh`.

Only `sbatch`, `squeue`, `scancel` and `tail` are run. Over ssh the batch
script travels on stdin, so nothing is left on the login node but the job's
output file. Every call has a timeout; failures raise SlurmError with the
tool's own message.
"""
from __future__ import annotations

import shlex
import subprocess

COMMAND_TIMEOUT_S = 60.0
# Job states after which the job no longer runs (squeue --states=all lists them for MinJobAge).
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})


class SlurmError(Exception):
    """A Slurm command failed, could not be run, or answered something unexpected."""


class Slurm:
    """The Slurm of one provisioner: local when `login` is empty, else `ssh [-i ssh_key] login`."""

    def __init__(self, login: str = "", ssh_key: str = "", env: dict | None = None):
        self.login = login
        self.ssh_key = ssh_key
        self.env = env

    def _argv(self, argv: list[str]) -> list[str]:
        if not self.login:
            return argv
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
        if self.ssh_key:
            ssh += ["-i", self.ssh_key, "-o", "IdentitiesOnly=yes"]
        return [*ssh, self.login, shlex.join(argv)]

    def run(self, argv: list[str], *, stdin: str | None = None) -> str:
        """stdout of `argv`; raises SlurmError with stderr when it fails."""
        full = self._argv(argv)
        where = f" on {self.login}" if self.login else ""
        try:
            done = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                                  env=self.env)
        except FileNotFoundError:
            raise SlurmError(f"{full[0]} is not installed on this machine"
                             + ("" if self.login else " (login is empty, so Slurm's tools run here)")) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]}{where} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()[-800:] or f"exit status {done.returncode}"
            raise SlurmError(f"{argv[0]}{where} failed: {message}")
        return done.stdout

    def submit(self, script: str, script_path: str, args: list[str]) -> str:
        """Submit a batch script; the Slurm job id. Locally `script_path` is submitted, over ssh `script`."""
        if self.login:
            out = self.run(["sbatch", "--parsable", *args], stdin=script)
        else:
            out = self.run(["sbatch", "--parsable", *args, script_path])
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        return job_id

    def states(self, job_ids: list[str]) -> dict[str, str]:
        """{job id: Slurm state} for the jobs squeue still knows; a job missing has ended long ago."""
        if not job_ids:
            return {}
        try:
            out = self.run(["squeue", "-h", "--states=all", "-o", "%i|%T", "-j", ",".join(job_ids)])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):  # every one of them is gone
                return {}
            raise
        found = {}
        for line in out.splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id:
                found[job_id] = state
        return found

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def tail(self, path: str, lines: int = 20) -> str:
        """The last lines of a file where the job runs ("" when it cannot be read)."""
        try:
            return self.run(["tail", "-n", str(lines), path]).strip()
        except SlurmError:
            return ""
