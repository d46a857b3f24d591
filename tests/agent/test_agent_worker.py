"""The agent end to end against a fake control plane: real HTTP, real processes, real files.

Register, run, stop, cancel and outages run against the real control plane too: test_agent_contract.py.
"""

import hashlib
import io
import json
import os
import sys
import tarfile
import threading
import time
import uuid

import pytest

from agent.session import Worker
from agent.worker import WorkerConfig, run_worker
from fake_control_plane import SESSION, assignment

from gpulayer.protocol.assignment import Assignment
from gpulayer.testing import host_pids, pid_alive

PY = sys.executable


def tarball(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def wait_for(predicate, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


JOB = """
import json, os, pathlib
data = pathlib.Path("data/in.txt").read_text()
for i in range(1200):
    print("line", i)
os.makedirs("out/deep", exist_ok=True)
pathlib.Path("out/result.txt").write_text(data.upper())
pathlib.Path("out/deep/env.json").write_text(json.dumps({k: os.environ.get(k) for k in [
    "GPULAYER_JOB_ID", "GPULAYER_TASK_ID", "GPULAYER_ATTEMPT", "GPULAYER_OUTPUT_DIR", "CUDA_VISIBLE_DEVICES",
    "HIDDEN_API_TOKEN", "JOB_SECRET", "PLAIN"]}))
"""


def test_job_with_source_input_and_outputs(plane, start_worker, monkeypatch):
    monkeypatch.setenv("HIDDEN_API_TOKEN", "do-not-leak")
    monkeypatch.setenv("PLAIN", "visible")
    source = plane.put_artifact(tarball({"job.py": JOB}))
    data = plane.put_artifact(b"hello input")
    plane.submit(assignment(1, ["python", "job.py"], source=source, inputs={"data/in.txt": data},
                            outputs=["out/", "missing.txt"], gpus=[1, 0], env={"JOB_SECRET": "s3"}))
    worker = start_worker(parallel=1)
    finish = plane.wait_finish(1)
    assert finish["outcome"] == "succeeded" and finish["exit_code"] == 0
    outputs = finish["outputs"]
    assert set(outputs) == {"out/result.txt", "out/deep/env.json"}
    assert plane.artifacts[outputs["out/result.txt"]] == b"HELLO INPUT"
    env = json.loads(plane.artifacts[outputs["out/deep/env.json"]])
    assert env["GPULAYER_TASK_ID"] == "1" and env["GPULAYER_JOB_ID"] == "101" and env["GPULAYER_ATTEMPT"] == "1"
    assert env["GPULAYER_OUTPUT_DIR"].endswith("tasks/1-1")
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert (env["HIDDEN_API_TOKEN"], env["JOB_SECRET"], env["PLAIN"]) == (None, "s3", "visible")
    assert isinstance(plane.starts[1]["pid"], int)
    logs = plane.logs[1]
    assert sorted(logs) == list(range(len(logs)))  # numbered from 0, no gap
    stdout = plane.log_texts(1, "stdout")
    assert stdout == [f"line {i}" for i in range(1200)]
    assert any("missing.txt" in text for text in plane.log_texts(1, "system"))
    assert worker.stop() == 0
    assert plane.deregistered
    assert plane.missing_header == []
    reg = plane.registrations[0]
    assert reg["slots"] == 1 and reg["version"] and reg["resources"]["gpus"] == 0 and reg["name"] == "w1"


def test_cancel_from_heartbeat_kills_the_group(plane, start_worker):
    marker = f"grandchild-{uuid.uuid4().hex}"  # found from outside: a sandboxed task has a PID namespace of its own
    code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {marker}']);"
            " print('ready', flush=True); time.sleep(600)")
    plane.submit(assignment(2, [PY, "-c", code]))
    start_worker()
    wait_for(lambda: "ready" in plane.log_texts(2))
    wait_for(lambda: any(e["task_id"] == 2 for hb in plane.heartbeats for e in hb["tasks"]))
    wait_for(lambda: host_pids(marker))
    group = host_pids(marker)  # the task (its code names the marker) and the grandchild
    plane.cancel.add(2)
    finish = plane.wait_finish(2)
    assert finish["outcome"] == "cancelled"
    wait_for(lambda: not any(pid_alive(pid) for pid in group))


def test_timeout_and_failure_outcomes(plane, start_worker):
    plane.submit(assignment(3, [PY, "-c", "import time; time.sleep(60)"], timeout_seconds=0.5))
    plane.submit(assignment(4, [PY, "-c", "import sys; sys.exit(3)"]))
    plane.submit(assignment(5, ["definitely-not-a-command-xyz"]))
    start_worker(parallel=3)
    timed_out = plane.wait_finish(3)
    assert timed_out["outcome"] == "timed_out" and "timeout_seconds=0.5" in timed_out["reason"]
    assert any("timeout" in text for text in plane.log_texts(3, "system"))
    assert plane.wait_finish(4)["outcome"] == "failed" and plane.finishes[4]["exit_code"] == 3
    assert plane.wait_finish(5)["exit_code"] == 127


def test_unsafe_bundle_fails_the_task(plane, start_worker, tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    source = plane.put_artifact(buffer.getvalue())
    plane.submit(assignment(6, [PY, "-c", "print('never')"], source=source))
    start_worker()
    finish = plane.wait_finish(6)
    assert finish["outcome"] == "failed" and "unsafe bundle" in finish["reason"]
    assert 6 in plane.starts and "never" not in plane.log_texts(6)
    assert not (tmp_path / "state/tasks/escape.txt").exists()


def test_wrong_digest_fails_the_task(plane, start_worker):
    digest = "sha256:" + hashlib.sha256(b"right").hexdigest()
    plane.artifacts[digest] = b"wrong"
    plane.submit(assignment(7, [PY, "-c", "pass"], inputs={"x": digest}))
    start_worker()
    assert "failed verification" in plane.wait_finish(7)["reason"]


def test_revoked_worker_kills_tasks_and_exits_3(plane, start_worker):
    plane.submit(assignment(10, [PY, "-c", "import time; print('up', flush=True); time.sleep(60)"]))
    worker = start_worker()
    wait_for(lambda: "up" in plane.log_texts(10))
    plane.revoked = True
    assert worker.wait() == 3
    assert plane.finishes[10]["outcome"] == "cancelled"


def test_idle_limit_exits_0(plane, worker_config):
    started = time.monotonic()
    assert run_worker(worker_config(max_idle_s=0.5)) == 0
    assert time.monotonic() - started < 10


def test_fatal_errors_are_one_line(plane, worker_config, capsys):
    assert run_worker(worker_config(url="http://10.1.2.3:8470")) == 2
    assert capsys.readouterr().err.strip().endswith("refusing plain HTTP to 10.1.2.3: use https:// or --insecure")
    assert run_worker(worker_config(join_token="glj_wrong")) == 2
    assert "join token" in capsys.readouterr().err
    plane.protocol = 2
    assert run_worker(worker_config()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpulayer worker: the control plane speaks protocol 2, this worker speaks 1: upgrade the worker (pip install -U gpulayer)"]


def test_multi_node_rendezvous_sets_torch_variables(plane, start_worker):
    show = "import os; print(' '.join(os.environ[k] for k in ['MASTER_ADDR','MASTER_PORT','WORLD_SIZE','RANK','NODE_RANK','LOCAL_RANK','GPULAYER_PEERS']))"
    for rank in (0, 1):
        plane.submit(assignment(20 + rank, [PY, "-c", show], job_id=200, rank=rank, index=rank, world_size=2))
    start_worker(parallel=2)
    for rank in (0, 1):
        assert plane.wait_finish(20 + rank)["outcome"] == "succeeded"
    peers = plane.rendezvous[200]
    deadline = time.time() + 5  # the start with the pid is sent again, from its own thread, once the command runs
    while not all(plane.starts[20 + rank].get("pid") for rank in (0, 1)) and time.time() < deadline:
        time.sleep(0.02)
    assert all(plane.starts[20 + rank].get("pid") for rank in (0, 1)), plane.starts
    master_addr, master_port = peers[0].rsplit(":", 1)
    for rank in (0, 1):
        out = plane.log_texts(20 + rank, "stdout")[0].split()
        assert out == [master_addr, master_port, "2", str(rank), str(rank), "0", f"{peers[0]},{peers[1]}"]


SERVICE = """
import http.server, os, sys, threading, time
port = int(os.environ["PORT"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("serving", port, flush=True)
time.sleep(1.0)
sys.exit(1)
"""


def test_service_restarts_on_a_new_port_then_ends(plane, start_worker):
    service = {"replicas": 1, "port": True, "restart": "always", "max_restarts": 1, "health": None, "weights": None}
    plane.submit(assignment(30, [PY, "-c", SERVICE], service=service))
    start_worker()
    finish = plane.wait_finish(30, timeout=30)
    assert finish["outcome"] == "failed" and "restarts used up" in finish["reason"]
    entries = [e for hb in plane.heartbeats for e in hb["tasks"] if e["task_id"] == 30]
    endpoints = {e["endpoint"] for e in entries if e["endpoint"]}
    assert len(endpoints) == 2 and all(ep.startswith("127.0.0.1:") for ep in endpoints)
    assert any(e["state"] == "restarting" and e["endpoint"] is None and e["restarts"] == 1 for e in entries)
    ports = [line.split()[1] for line in plane.log_texts(30, "stdout")]
    assert len(set(ports)) == 2
    assert any(text.startswith("restart 1: exited with code 1") for text in plane.log_texts(30, "system"))


def test_session_header_and_token_on_every_call(plane, start_worker):
    plane.submit(assignment(40, [PY, "-c", "print('x')"]))
    worker = start_worker()
    plane.wait_finish(40)
    worker.stop()
    assert plane.missing_header == []
    assert SESSION  # the fake refuses calls without the session token: reaching finish proves it was sent


def test_rank_dropped_quietly_when_its_gang_is_replaced_during_rendezvous(plane, start_worker, caplog):
    plane.submit(assignment(30, [PY, "-c", "print('never')"], job_id=300, rank=0, index=0, world_size=2))
    start_worker()
    deadline = time.time() + 10
    while 300 not in plane.rendezvous and time.time() < deadline:
        time.sleep(0.02)
    with caplog.at_level("INFO", logger="gpulayer.agent"):
        del plane.assigned[30]  # the control plane released the gang: rendezvous now answers 409
        while "task_dropped" not in caplog.text and time.time() < deadline:
            time.sleep(0.05)
    assert "task_dropped task_id=30" in caplog.text and "task_agent_error" not in caplog.text, caplog.text
    assert 30 not in plane.finishes and plane.log_texts(30, "stdout") == []



def test_a_worker_has_a_session_only_once_registered(worker_config):
    """What registering makes (transport, inventory, task context) is one Session; before it, none."""
    worker = Worker(worker_config(), threading.Event())
    with pytest.raises(RuntimeError, match="not registered"):
        worker.session
    worker.close()
    worker.close()  # nothing opened yet, and twice is harmless


def test_launch_is_once_per_task_whoever_asks(launch_only_worker):
    """The acquire loop and a finish's hand-over may bring the same assignment: one runner only."""
    worker = launch_only_worker
    task = Assignment(task_id=7, job_id=107, command=["true"])
    first = worker._launch(task)
    assert worker._launch(task) is first
    worker.join_launched()
    assert worker.launched == [7]


def test_one_acquire_brings_every_free_slot_and_a_finish_its_next(plane, start_worker):
    """The agent asks for `max_tasks` = its free slots and launches each assignment it gets."""
    for task_id in (40, 41, 42):
        plane.submit(assignment(task_id, [PY, "-c", "import time; time.sleep(0.3)"]))
    start_worker(parallel=3)
    for task_id in (40, 41, 42):
        assert plane.wait_finish(task_id)["outcome"] == "succeeded"
    assert plane.acquires[0]["max_tasks"] == 3 and set(plane.starts) == {40, 41, 42}
    assert all(f["max_tasks"] >= 1 for f in plane.finishes.values() if f.get("next"))
