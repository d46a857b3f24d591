"""``python -m agent``: run the worker agent alone (needs only requests and nvidia-ml-py)."""

import argparse
import os
import sys

from gpulayer.protocol import parse_duration
from gpulayer.proc.ending import run_and_end
from gpulayer.proc.malloc import keep_freed_memory

from . import __version__
from .hardening import JOIN_TOKEN_VAR, TokenFileError, read_token_file
from .sandbox.bwrap import DEFAULT_MODE as DEFAULT_SANDBOX
from .worker import WorkerConfig, run_worker


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"labels are key=value, got {text!r}")
    return key, value


def _seconds(text: str) -> float:
    """A duration as every option reads it (gpulayer.protocol.parse_duration: 90, 30m, 1:00:00)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``gpulayer worker start``, plus --url and --ca-file."""
    parser = argparse.ArgumentParser(prog="python -m agent", description="GPUlayer worker agent.")
    add = parser.add_argument
    add("--url", default=os.environ.get("GPULAYER_URL"), help="control plane URL, https://host:8470 (env GPULAYER_URL)")
    add("--token", default=None, help="join token glj_... (prefer --token-file or env GPULAYER_JOIN_TOKEN: flags show in process listings)")
    add("--token-file", default=os.environ.get("GPULAYER_JOIN_TOKEN_FILE"), help="file holding the join token; wins over --token and GPULAYER_JOIN_TOKEN (env GPULAYER_JOIN_TOKEN_FILE)")
    add("--ca-file", default=os.environ.get("GPULAYER_CA_FILE"), help="CA certificate to verify the control plane (env GPULAYER_CA_FILE)")
    add("--ca-fingerprint", default=os.environ.get("GPULAYER_CA_FINGERPRINT"), help="sha256:HEX of the control plane's CA; pinned on first contact (env GPULAYER_CA_FINGERPRINT)")
    add("--name", default=None, help="worker name (default: host name)")
    add("--label", action="append", type=_label, default=[], metavar="K=V", help="a label, repeatable")
    add("--python", default=None, help="interpreter that runs a task's `python`; its bin dir goes first on PATH")
    add("--advertise-address", default=None, help="address other machines reach this worker at (services, multi-node); default: its address on the route to the control plane")
    add("--parallel", type=int, default=1, help="tasks at once (default 1)")
    add("--cpus", type=float, default=None, help="advertised CPUs (default: detected)")
    add("--gpus", type=int, default=None, help="advertised GPUs; 0 means none (default: detected)")
    add("--gpu-sharing", choices=("off", "mps", "time-slice"), default="off", help="share each GPU between fractional tasks (submit --gpu-fraction / --gpu-memory): mps (NVIDIA MPS, its control daemon per GPU), time-slice (the device shared, memory shares enforced by the agent), off: whole GPUs only (default off)")
    add("--pin-cpus", action="store_true", default=os.environ.get("GPULAYER_WORKER_PIN_CPUS") == "1", help="run each task on the CPUs local to its GPUs (their NUMA node), split between tasks that ask --cpus; tasks without GPUs on the CPUs no GPU task holds (env GPULAYER_WORKER_PIN_CPUS=1)")
    add("--ram-mb", type=int, default=None, help="advertised memory in MB (default: detected)")
    add("--max-idle", type=_seconds, default=0.0, help="exit after this long idle (seconds, 30m, 1:00:00, ...); 0 disables")
    add("--drain-timeout", type=_seconds, default=0.0, help="on SIGTERM, take no new task and let running ones finish for up to this long (seconds, 10m, ...) before stopping them (default 0)")
    add("--state-dir", default=os.environ.get("GPULAYER_WORKER_STATE_DIR", "~/.gpulayer/worker"), help="task working dirs and the pinned CA (env GPULAYER_WORKER_STATE_DIR)")
    add("--sandbox", choices=("auto", "bwrap", "none"), default=os.environ.get("GPULAYER_WORKER_SANDBOX", DEFAULT_SANDBOX), help=f"auto: each task in a bubblewrap sandbox where bwrap works, else unsandboxed with a warning; bwrap: or refuse to start; none: unconfined (default {DEFAULT_SANDBOX}; env GPULAYER_WORKER_SANDBOX)")
    add("--run-as", default=os.environ.get("GPULAYER_WORKER_RUN_AS"), help="user a root agent's sandboxed tasks run as (default gpulayer-task, else nobody; env GPULAYER_WORKER_RUN_AS)")
    add("--sandbox-bind", action="append", default=[], metavar="HOST[:TASK][:ro]", help="bind a host path into every sandboxed task (repeatable): /data:/data:ro, /scratch")
    add("--allow-root-tasks", action="store_true", help="let a job that asks (run_as_root) run as root when the agent is root")
    add("--no-exec", action="store_true", default=os.environ.get("GPULAYER_WORKER_NO_EXEC") == "1", help="run no command for the relay: refuse gpulayer exec (and later shell, ssh) into this worker's tasks (env GPULAYER_WORKER_NO_EXEC=1)")
    add("--insecure", action="store_true", help="allow plain http:// to a non-loopback host")
    add("--version", action="version", version=f"gpulayer-agent {__version__} (protocol 1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the worker, return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        token = read_token_file(args.token_file) if args.token_file else args.token or os.environ.get(JOIN_TOKEN_VAR)
    except TokenFileError as exc:
        print(f"gpulayer worker: {exc}", file=sys.stderr)
        return 2
    if not args.url:
        print("gpulayer worker: no control plane URL: pass --url or set GPULAYER_URL", file=sys.stderr)
        return 2
    if not token:
        print("gpulayer worker: no join token: pass --token-file or set GPULAYER_JOIN_TOKEN", file=sys.stderr)
        return 2
    config = WorkerConfig(
        url=args.url, join_token=token, name=args.name, labels=dict(args.label), python=args.python,
        advertise_address=args.advertise_address, parallel=args.parallel, cpus=args.cpus, gpus=args.gpus,
        ram_mb=args.ram_mb, gpu_sharing=args.gpu_sharing, max_idle_s=args.max_idle, drain_timeout_s=args.drain_timeout, state_dir=args.state_dir, ca_file=args.ca_file,
        ca_fingerprint=args.ca_fingerprint, insecure=args.insecure, sandbox=args.sandbox, run_as=args.run_as,
        allow_root_tasks=args.allow_root_tasks, sandbox_binds=args.sandbox_bind, hidden_paths=[args.token_file] if args.token_file else [],
        no_exec=args.no_exec, pin_cpus=args.pin_cpus,
    )
    return run_worker(config)


if __name__ == "__main__":
    keep_freed_memory()
    run_and_end(main)
