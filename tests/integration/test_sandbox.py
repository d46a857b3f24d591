"""Tasks in a bubblewrap sandbox (issue 24, part 1): real server, real worker processes, real bwrap.

The attack of the issue: a job reads the control plane's client.json and local-tokens.json, the agent's state
dir and /proc/*/environ, and sends SIGSTOP to the agent: with the sandbox, nothing is read, nothing stopped.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from integration_cluster import Cluster

from gpulayer.testing import pid_alive, wait_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or not sys.platform.startswith("linux"),
                                reason="needs bubblewrap (Debian package bubblewrap) on Linux")

SECRET = "s3cret-token-never-to-be-read"

ATTACK = r"""
for f in "$CP_HOME/client.json" "$CP_HOME/local-tokens.json" "$TOKEN_FILE"; do
  cat "$f" 2>/dev/null && echo "READ $f"
done
ls "$STATE_DIR" 2>/dev/null | grep -v '^tasks$' | sed 's/^/STATE /'
for p in /proc/[0-9]*/environ; do
  grep -a -q GPULAYER_JOIN_TOKEN= "$p" 2>/dev/null && echo "ENVIRON $p"
done
kill -STOP "$AGENT_PID" 2>/dev/null && echo "STOPPED $AGENT_PID"
echo "uid=$(id -u)"
echo attack-done
"""


def module_cluster(tmp_path_factory, name: str):
    """A control plane for a module's workers (test_shared_sandbox.py's too), its workers stopped at the end."""
    c = Cluster(tmp_path_factory.mktemp(name)).start_server()
    try:
        yield c
    finally:
        for worker in list(c.workers.values()):
            if worker.running:
                worker.stop()
        c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "sandbox")


def run_job(cluster: Cluster, labels: dict, command: list[str], **spec) -> tuple[dict, str]:
    job_id = cluster.submit({"command": command, "labels": labels, **spec})
    done = cluster.wait_job(job_id, timeout=60)
    return done, cluster.log_text(job_id)


def start(cluster: Cluster, name: str, *args: str, env: dict | None = None, **options):
    """Worker ``name`` (its label pool=NAME), sandboxed by default (auto) unless ``args`` say otherwise."""
    return cluster.start_worker(name, labels={"pool": name}, args=list(args), env=env or {}, **options)


def test_the_attack_reads_nothing_and_stops_nothing(cluster, tmp_path):
    cp_home = tmp_path / "cp-home"  # what `gpulayer up` leaves in its home
    cp_home.mkdir()
    for name in ("client.json", "local-tokens.json"):
        (cp_home / name).write_text(f'{{"token": "{SECRET}"}}')
    token_file = tmp_path / "join-token"
    token_file.write_text(cluster.join_token)
    worker = start(cluster, "attacked", "--token-file", str(token_file), env={"GPULAYER_HOME": str(cp_home)})
    env = {"CP_HOME": str(cp_home), "TOKEN_FILE": str(token_file), "STATE_DIR": str(worker.state_dir),
           "AGENT_PID": str(worker.pid)}
    done, text = run_job(cluster, {"pool": "attacked"}, ["sh", "-c", ATTACK], env=env)
    assert done["state"] == "succeeded" and "attack-done" in text, text
    assert SECRET not in text and cluster.join_token not in text
    assert "READ " not in text and "STATE " not in text and "ENVIRON " not in text and "STOPPED" not in text, text
    if os.geteuid() == 0:
        assert "uid=0" not in text, "a root agent's task ran as root"
    isolation = cluster.online_worker("attacked")["isolation"]
    assert isolation["sandbox"] == "bwrap" and "warning" not in isolation, isolation
    assert isolation["user"] == ("gpulayer-task" if os.geteuid() == 0 else None) or isolation["user"] == "nobody"
    # The agent was not stopped: it runs the next job.
    again, _ = run_job(cluster, {"pool": "attacked"}, ["true"])
    assert again["state"] == "succeeded" and pid_alive(worker.pid)
    # Without the sandbox (today's behaviour, --sandbox none) the same job reads the files: the test can tell.
    start(cluster, "open", "--sandbox", "none", env={"GPULAYER_HOME": str(cp_home)})
    env["STATE_DIR"] = str(cluster.workers["open"].state_dir)
    env["AGENT_PID"] = "not-a-pid"  # a stopped agent would hang the module
    _, text = run_job(cluster, {"pool": "open"}, ["sh", "-c", ATTACK], env=env)
    assert f"READ {cp_home}/client.json" in text and f"uid={os.geteuid()}" in text, text


def test_tasks_see_neither_each_others_processes_nor_files(cluster):
    worker = start(cluster, "pair", parallel=2)
    tasks = worker.state_dir / "tasks"
    first = cluster.submit({"command": ["sh", "-c", "echo private > mine.txt; echo ready; exec sleep 1234.5"],
                            "labels": {"pool": "pair"}})
    wait_for(lambda: "ready" in cluster.log_text(first), 30, "the first task to run")
    other = next(path.parent for path in tasks.rglob("mine.txt"))  # tasks/ may also hold a sandbox made ahead
    probe = (f"ps ax -o pid,args; cat {other}/mine.txt 2>&1; ls {tasks}; echo self=$$")
    done, text = run_job(cluster, {"pool": "pair"}, ["sh", "-c", probe])
    cluster.request("POST", f"/v1/jobs/{first}/cancel")
    assert done["state"] == "succeeded", text
    assert "1234.5" not in text and "private" not in text, text
    # Alone in its PID namespace: bwrap's init, the bash that started it in a sandbox made ahead (agent/sandbox/spares.py),
    # itself and its ps.
    pids = [found[1] for found in (re.match(r"\s*(\d+) \S", line) for line in text.splitlines()) if found]
    assert pids in (["1", "2", "3"], ["1", "2", "3", "4"]) and re.search(r"^self=[23]$", text, re.M), text
    listed = [line for line in text.splitlines() if line.strip() and "-" in line and "/" not in line]
    assert other.name not in listed and (other.parent.name == "tasks" or other.parent.name not in listed), text


def test_timeout_and_cancel_end_the_whole_sandbox_after_the_grace(cluster):
    start(cluster, "killer", parallel=2)
    marker = "sleep 4321.5"
    job = cluster.submit({"command": ["sh", "-c", f"{marker} & {marker} & wait"], "labels": {"pool": "killer"},
                          "timeout_seconds": 1})
    done = cluster.wait_job(job, timeout=60)
    assert done["state"] == "failed" or done["tasks"][-1]["state"] == "timed_out", done
    assert wait_for(lambda: not processes_running(marker), 10, "the task's sleeps to be gone")

    trap = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 1000 & wait"
    job = cluster.submit({"command": ["sh", "-c", trap], "labels": {"pool": "killer"}})
    wait_for(lambda: "ready" in cluster.log_text(job), 30, "the trapping task to run")
    cluster.request("POST", f"/v1/jobs/{job}/cancel")
    assert cluster.wait_job(job, timeout=60)["state"] == "cancelled"
    text = wait_for(lambda: "finished:" in (t := cluster.log_text(job)) and t, 30, "the cancelled task's finish")
    assert "got-term" in text and "exit code 3" in text, text
    assert not processes_running("sleep 1000")


def processes_running(words: str) -> list[int]:
    """Pids (of this host) whose command line holds ``words``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if words in raw.replace(b"\0", b" ").decode(errors="replace") and int(entry) != os.getpid():
                found.append(int(entry))
    return found


def test_an_exit_code_and_a_missing_command_read_as_before(cluster):
    start(cluster, "codes")
    done, _ = run_job(cluster, {"pool": "codes"}, ["sh", "-c", "exit 7"])
    assert done["exit_code"] == 7
    done, _ = run_job(cluster, {"pool": "codes"}, ["sh", "-c", "kill -TERM $$"])
    assert done["exit_code"] == 128 + 15
    done, text = run_job(cluster, {"pool": "codes"}, ["no-such-command-here"])
    assert done["exit_code"] == 127 and "cannot start 'no-such-command-here'" in text, text


def test_network_none_leaves_a_loopback_only(cluster):
    start(cluster, "netless")
    done, text = run_job(cluster, {"pool": "netless"}, ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"],
                         network="none")
    assert done["state"] == "succeeded" and [l.strip() for l in text.splitlines()[:-1]] == ["lo"], text
    start(cluster, "netless-open", "--sandbox", "none")
    done, text = run_job(cluster, {"pool": "netless-open"}, ["true"], network="none")
    assert done["state"] == "failed" and "network none needs a sandbox" in text, text


def test_outputs_written_by_the_task_user_are_collected(cluster):
    start(cluster, "outputs")
    done, text = run_job(cluster, {"pool": "outputs"}, ["sh", "-c", "mkdir -p out && id -u > out/uid.txt"],
                         outputs=["out/uid.txt"])
    assert done["state"] == "succeeded" and "1 output file" in text, text


def test_auto_without_bwrap_falls_back_with_a_warning_and_bwrap_refuses_to_start(cluster, tmp_path):
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for name in os.listdir(directory):
            if name != "bwrap" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(directory, name))
    path = {"PATH": str(bin_dir)}
    worker = start(cluster, "no-bwrap", env=path)
    done, text = run_job(cluster, {"pool": "no-bwrap"}, ["sh", "-c", "echo uid=$(id -u)"])
    assert done["state"] == "succeeded" and f"uid={os.geteuid()}" in text, text
    assert "tasks are not sandboxed: bwrap is not installed" in Path(worker.log_path).read_text()
    said = cluster.online_worker("no-bwrap")["isolation"]
    assert said["sandbox"] == "none" and "bwrap is not installed" in said["warning"], said
    listing = cluster.cli("worker", "list")
    assert listing.returncode == 0, listing
    rows = {line.split()[1]: line for line in listing.stdout.splitlines()[1:] if line.strip()}
    assert " none! " in rows["no-bwrap"] and " bwrap" in rows["attacked"], listing.stdout

    strict = start(cluster, "strict", "--sandbox", "bwrap", env=path, wait=False)
    assert strict.wait(60) == 2
    assert "--sandbox bwrap: bwrap is not installed" in Path(strict.log_path).read_text()


def _gpu_here() -> bool:
    from agent.gpu.nvml import Nvml
    nvml = Nvml.open()
    if nvml is None:
        return False
    try:
        return bool(nvml.devices())
    finally:
        nvml.close()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_here(), reason="no NVIDIA GPU here (NVML): device binding not run")
def test_a_gpu_task_gets_the_device_nodes_of_its_gpus_only(cluster):
    start(cluster, "gpus", "--sandbox", "bwrap", gpus=None)
    listed = "ls /dev | grep '^nvidia[0-9]*$'; nvidia-smi -L | grep -c '^GPU'"
    done, text = run_job(cluster, {"pool": "gpus"}, ["sh", "-c", listed], gpus=1)
    assert done["state"] == "succeeded", text
    lines = [line.strip() for line in text.splitlines()[:-1]]
    nodes = [line for line in lines if line.startswith("nvidia")]
    assert len(nodes) == 1 and lines[-1] == "1", text
    done, text = run_job(cluster, {"pool": "gpus"}, ["sh", "-c", "ls /dev | grep -c '^nvidia' || true"], gpus=0)
    assert done["state"] == "succeeded" and text.splitlines()[0].strip() == "0", text


def test_a_bad_sandbox_option_is_a_usage_error_that_starts_nothing(cluster, tmp_path):
    for args in (["worker", "start", "--sandbox", "box"], ["up", "--sandbox", "box"],
                 ["worker", "start", "--sandbox-bind", "relative/path"],
                 ["worker", "start", "--sandbox-bind", f"{tmp_path}/missing:/data"]):
        done = cluster.cli(*args)
        assert done.returncode == 2 and "--sandbox" in done.stderr and "Traceback" not in done.stderr, done


def test_a_sandbox_bind_shows_a_host_dir_to_every_task(cluster, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o1777)
    (data / "in.txt").write_text("shared input")
    start(cluster, "bound", "--sandbox-bind", f"{data}:/tmp/data:ro", "--sandbox-bind", str(data))
    done, text = run_job(cluster, {"pool": "bound"},
                         ["sh", "-c", f"cat /tmp/data/in.txt; echo; echo out > {data}/out.txt"])
    assert done["state"] == "succeeded" and text.splitlines()[0] == "shared input", text
    assert (data / "out.txt").read_text() == "out\n"
