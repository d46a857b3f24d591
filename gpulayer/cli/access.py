"""Getting into a running job through the control plane's relay: `gpulayer exec`, `gpulayer shell`, `gpulayer
port-forward` (docs/access.md).

ssh-config and ssh-proxy are at the end.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import client_of, fail, global_options, home_of
from gpulayer.client.errors import ClientError

#: The exit status of `gpulayer exec` when the relay itself failed (as ssh's 255): never the command's.
RELAY_FAILED = 255

#: What every command into a job's task takes: the job, and one of --index, --replica, --rank (task_index()).
JobArg = Annotated[int, typer.Argument(help="The job.", metavar="JOB", show_default=False)]
IndexOpt = Annotated[
    Optional[int], typer.Option("--index", min=0, metavar="I", help="The array element to enter (default: the job's first running task).")
]
ReplicaOpt = Annotated[Optional[int], typer.Option("--replica", min=0, metavar="R", help="The service replica to enter.")]
RankOpt = Annotated[Optional[int], typer.Option("--rank", min=0, metavar="R", help="The multi-node rank to enter.")]


def task_index(index: int | None, replica: int | None, rank: int | None) -> int | None:
    """The task index the options name (they name the same thing); a usage error for more than one."""
    chosen = [(flag, value) for flag, value in (("--index", index), ("--replica", replica), ("--rank", rank)) if value is not None]
    if len(chosen) > 1:
        raise typer.BadParameter("give one of --index, --replica and --rank (they name the same task index)", param_hint=chosen[1][0])
    return chosen[0][1] if chosen else None


def exec_command(
    ctx: typer.Context,
    job_id: JobArg,
    command: Annotated[
        Optional[list[str]], typer.Argument(help="The command and its arguments, after --.", metavar="-- CMD...", show_default=False)
    ] = None,
    index: IndexOpt = None,
    replica: ReplicaOpt = None,
    rank: RankOpt = None,
) -> None:
    """Run a command in a running job's task: its cwd, environment, GPUs, user and sandbox.

    stdin, stdout and stderr are streamed through the control plane (the worker may sit behind NAT); the
    exit status is the command's (128+N when signal N killed it), 255 when the relay failed. Ctrl-C sends
    SIGINT to the command; a third one ends it.

    \b
    Examples:
      gpulayer exec 12 -- nvidia-smi
      echo hi | gpulayer exec 12 -- cat
      gpulayer exec 12 --index 3 -- ls -la
    """
    task = task_index(index, replica, rank)
    if not command:
        raise typer.BadParameter("give the command to run after --: gpulayer exec JOB -- CMD...", param_hint="CMD")
    client = client_of(ctx)
    if not hasattr(client, "session"):
        raise fail("exec needs a control plane (GPULAYER_URL): a local run (--target local) has no relay", 2)
    raise typer.Exit(_run(client, job_id, command, task))


def _run(client, job_id: int, command: list[str], index: int | None) -> int:
    from gpulayer.client.relay import run_exec

    interrupts = [0]
    streams: list = []

    def on_open(stream) -> None:
        streams.append(stream)

    def on_sigint(signum, frame) -> None:
        interrupts[0] += 1
        if not streams:
            raise KeyboardInterrupt
        if interrupts[0] >= 3:
            streams[0].close({"reason": "interrupted (Ctrl-C three times)"})
            raise KeyboardInterrupt
        streams[0].signal("INT")

    previous = signal.signal(signal.SIGINT, on_sigint)

    def to(pipe):
        def write(chunk: bytes) -> None:
            pipe.write(chunk)
            pipe.flush()

        return write

    try:
        return run_exec(
            client,
            job_id,
            command,
            index=index,
            stdin=sys.stdin.buffer,
            on_stdout=to(sys.stdout.buffer),
            on_stderr=to(sys.stderr.buffer),
            on_open=on_open,
        )
    except ClientError as exc:
        sys.stderr.write(f"Error: {exc.message}\n")
        return RELAY_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("Error: interrupted\n")
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def shell_command(
    ctx: typer.Context,
    job_id: JobArg,
    command: Annotated[
        Optional[list[str]],
        typer.Argument(help="A command to run on the terminal instead of the task's shell, after --.", metavar="[-- CMD...]", show_default=False),
    ] = None,
    index: IndexOpt = None,
    replica: ReplicaOpt = None,
    rank: RankOpt = None,
) -> None:
    """An interactive shell in a running job's task: a terminal in its cwd, environment, user and sandbox.

    The local terminal goes to raw mode, so every key reaches the remote terminal: Ctrl-C and Ctrl-Z
    signal the remote foreground job, Ctrl-D ends the shell; the window's size follows resizes, and TERM
    is passed (tmux, screen). The exit status is the remote shell's, 255 when the relay failed. stdin must
    be a terminal: without one, use gpulayer exec JOB -- CMD.

    \b
    Examples:
      gpulayer shell 12
      gpulayer shell 12 --index 3
      gpulayer shell 12 -- htop
    """
    task = task_index(index, replica, rank)
    if not sys.stdin.isatty():
        raise fail("gpulayer shell needs a terminal on stdin (it puts it in raw mode); to run a command without one: gpulayer exec JOB -- CMD", 2)
    client = client_of(ctx)
    if not hasattr(client, "session"):
        raise fail("shell needs a control plane (GPULAYER_URL): a local run (--target local) has no relay", 2)
    from gpulayer.client.relay_shell import Hangup, run_shell

    try:
        code = run_shell(client, job_id, command or None, task)
    except ClientError as exc:
        sys.stderr.write(f"Error: {exc.message}\n")
        code = RELAY_FAILED
    except Hangup as exc:
        sys.stderr.write(f"Error: {signal.Signals(exc.signum).name}: the shell's stream was closed\n")
        code = 128 + exc.signum
    except KeyboardInterrupt:
        sys.stderr.write("Error: interrupted\n")
        code = 130
    raise typer.Exit(code)


# -- port-forward --------------------------------------------------------------------------------


def port_forward_command(
    ctx: typer.Context,
    job_id: JobArg,
    ports: Annotated[
        str,
        typer.Argument(
            help="REMOTE, or LOCAL:REMOTE: the port in the task, and the local one (LOCAL empty or 0: a free one, printed).",
            metavar="[LOCAL:]REMOTE",
            show_default=False,
        ),
    ],
    index: IndexOpt = None,
    replica: ReplicaOpt = None,
    rank: RankOpt = None,
    address: Annotated[str, typer.Option("--address", metavar="ADDR", help="The local address to listen on.")] = "127.0.0.1",
) -> None:
    """Forward local TCP connections to a port in a running job's task, through the control plane.

    kubectl's semantics: `8888` listens on local port 8888 and reaches 8888 in the task; `9000:8888` listens
    on 9000; `:8888` (or `0:8888`) picks a free local port and prints it. Each connection is its own stream
    (many at once, half-closes kept); the worker may sit behind NAT. It runs until Ctrl-C; when the task's
    agent reconnects, open connections end with an error and new ones work once it is back.

    \b
    Examples:
      gpulayer port-forward 12 8888
      gpulayer port-forward 12 :8888 --replica 1
      gpulayer port-forward 12 9000:8888 --address 0.0.0.0
    """
    from gpulayer.client.forward import PortForward, parse_ports, refuse_unless_running

    try:
        local, remote = parse_ports(ports)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="[LOCAL:]REMOTE") from None
    chosen = task_index(index, replica, rank)
    client = client_of(ctx)
    if not hasattr(client, "session"):
        raise fail("port-forward needs a control plane (GPULAYER_URL): a local run (--target local) has no relay", 2)

    def report(text: str) -> None:
        sys.stderr.write(f"Error: {text}\n")
        sys.stderr.flush()

    forward = PortForward(client, job_id, remote, local, address=address, index=chosen, on_event=report)
    try:
        # a job that is not there (or not yours), or with nothing running, fails now, as exec does
        job = client.get_job(job_id)
        refuse_unless_running(job.element(chosen) if chosen is not None else job.data, chosen)
        forward.start()
    except ClientError as exc:
        raise fail(exc.message) from None
    except OSError as exc:
        raise fail(f"cannot listen on {address}:{local}: {exc.strerror or exc}") from None
    print(f"Forwarding from {address}:{forward.local_port} -> {remote}", flush=True)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        forward.close()


# -- ssh (docs/access.md, "SSH") -----------------------------------------------------------------


def ssh_config_command(
    ctx: typer.Context,
    known_hosts: Annotated[
        Optional[Path],
        typer.Option("--known-hosts", metavar="FILE", help="Where to write the known_hosts file the block names (default: HOME/ssh/known_hosts)."),
    ] = None,
) -> None:
    """Print an OpenSSH config block for `ssh gpulayer-JOB` (and scp, rsync -e ssh, ssh -L, VS Code Remote-SSH).

    Writes a known_hosts file that trusts the control plane's SSH host CA for gpulayer-* names (so no host
    key prompt, and no StrictHostKeyChecking=no) and prints a `Host gpulayer-*` block whose ProxyCommand
    is `gpulayer ssh-proxy`: add it to ~/.ssh/config. `gpulayer-JOB` is the job's first running task,
    `gpulayer-JOB-INDEX` its array element, service replica or multi-node rank INDEX.

    \b
    Examples:
      gpulayer ssh-config >> ~/.ssh/config
      ssh gpulayer-12 nvidia-smi
      scp model.pt gpulayer-12:
      rsync -a data/ gpulayer-12-3:data/
      ssh -L 8888:localhost:8888 gpulayer-12
    """
    from gpulayer.client.ssh import config_block, host_ca, write_known_hosts

    client = client_of(ctx)
    if not hasattr(client, "session"):
        raise fail("ssh-config needs a control plane (GPULAYER_URL): a local run (--target local) has no relay", 2)
    try:
        ca_public = host_ca(client)
    except ClientError as exc:
        raise fail(exc.message, 1) from None
    path = (known_hosts or home_of(ctx) / "ssh" / "known_hosts").expanduser().absolute()
    write_known_hosts(path, ca_public)
    verify = client.session.verify
    home = global_options(ctx).home
    typer.echo(config_block(path, client.url, verify if isinstance(verify, str) else None, str(home) if home else None), nl=False)


def ssh_proxy_command(
    ctx: typer.Context,
    host: Annotated[str, typer.Argument(help="The task's SSH name: gpulayer-JOB or gpulayer-JOB-INDEX.", metavar="HOST", show_default=False)],
) -> None:
    """The ProxyCommand of `gpulayer ssh-config`'s block: an `ssh` relay stream on stdin and stdout.

    Not run by hand: OpenSSH starts it (ProxyCommand ... %n). Exit status 255 with `Error: ...` when the
    relay refused or failed, as ssh's own.

    \b
    Examples:
      ssh -o ProxyCommand="gpulayer ssh-proxy %n" gpulayer-12
    """
    from gpulayer.client.ssh import parse_host, run_proxy

    try:
        parse_host(host)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="HOST") from None
    client = client_of(ctx)
    if not hasattr(client, "session"):
        raise fail("ssh-proxy needs a control plane (GPULAYER_URL): a local run (--target local) has no relay", 2)
    try:
        code = run_proxy(client, host)
    except ClientError as exc:
        sys.stderr.write(f"Error: gpulayer-ssh-proxy: {exc.message}\n")
        code = RELAY_FAILED
    raise typer.Exit(code)
