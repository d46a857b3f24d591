"""A single-node Slurm cluster on loopback, started without systemd (tests and scripts/bench_vs_slurm.py).

`LocalSlurm(root).start()` writes `slurm.conf` under `root`, starts slurmctld
and slurmd in the foreground (`-D`) as child processes, and waits until
`sinfo` shows the node idle. Commands run with `env()` (SLURM_CONF set).
`ensure_installed()` installs Debian's packages when they are missing and we
are root; it returns None, or the reason Slurm cannot be had.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from gpulayer.testing import free_port

PACKAGES = ("slurmctld", "slurmd", "slurm-client")
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}")
                                       if os.access(p, os.X_OK)), None)


def ensure_installed() -> str | None:
    """None when Slurm's daemons and client are here (installing them with apt-get as root), else why not."""
    if all(_which(b) for b in BINARIES):
        return None
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it needs root (apt-get install slurmctld slurmd slurm-client)"
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[-500:]}"
    missing = [b for b in BINARIES if not _which(b)]
    return f"installed {', '.join(PACKAGES)} but {', '.join(missing)} is still missing" if missing else None


def memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


class LocalSlurm:
    """One slurmctld + one slurmd on this machine; `extra` lines are appended to slurm.conf."""

    def __init__(self, root: Path, *, cpus: int | None = None, extra: list[str] | tuple = ()):
        self.root = Path(root)
        self.cpus = cpus or os.cpu_count() or 1
        self.extra = list(extra)
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        return {**(base if base is not None else os.environ), "SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=gpulayertest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            *self.extra,
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={memory_mb() - 512} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        # Daemons read cgroup.conf beside slurm.conf when present; an empty one keeps them off cgroups.
        (self.root / "cgroup.conf").write_text("")

    def start(self, timeout: float = 60) -> "LocalSlurm":
        """Start both daemons and wait for the node to be idle; raises RuntimeError with their logs."""
        self.write_conf()
        for daemon in ("slurmctld", "slurmd"):
            log = open(self.root / "log" / f"{daemon}.out", "w")
            argv = [_which(daemon), "-D", "-f", str(self.conf)]
            if daemon == "slurmctld":
                argv.append("-c")  # a clean start: no jobs from an earlier run
            self.procs.append(subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
            time.sleep(0.3)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Slurm daemon exited early:\n{self.logs()}")
            state = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state in ("idle", "idle*") and "*" not in state:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"the Slurm node was not idle after {timeout} s:\n{self.logs()}")

    def run(self, *argv: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, check=check, timeout=timeout,
                              **kwargs)

    def queue(self) -> list[str]:
        """Lines of `squeue` (pending and running jobs)."""
        return [line for line in self.run("squeue", "-h", "-o", "%i %T").stdout.splitlines() if line.strip()]

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                out.append(f"--- {name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job, then stop slurmd and slurmctld (SIGTERM, SIGKILL after 10 s)."""
        if self.procs and all(p.poll() is None for p in self.procs):
            self.run("scancel", "--full", "-u", "root", check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.procs.clear()
