"""Services end to end: a real HTTP service on two real workers behind a real control plane.

The service is a small script (below): it listens on $PORT and answers
/healthz (200, or 500 after /sick), /pid, and /exit (exits 0). It is passed
whole (python -c), so a sandboxed task needs no file of the host. Its /pid is
its pid in its own PID namespace when sandboxed: the tests find a replica's
host pids from outside instead (`replica`), by the script's marker and $PORT.
"""
from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from gpulayer.testing import host_pids, pid_alive, wait_for

MARKER = "gpulayer-test-service"
SERVICE = textwrap.dedent(f"""
    # {MARKER}
    import http.server, os, sys, threading
    state = {{"sick": False}}
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if self.path == "/exit":
                self.send_response(200); self.end_headers(); self.wfile.write(b"bye")
                threading.Thread(target=lambda: os._exit(0)).start()
                return
            if self.path == "/sick":
                state["sick"] = True
            code = 500 if self.path == "/healthz" and state["sick"] else 200
            self.send_response(code); self.end_headers()
            self.wfile.write(str(os.getpid()).encode())
    print("serving on", os.environ["PORT"], flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
""")


@pytest.fixture(scope="module")
def service_cmd():
    return [sys.executable, "-c", SERVICE]


def replica(endpoint: str) -> list[int]:
    """The host pids of the replica serving `endpoint` (with a sandbox, its bwrap's too)."""
    return host_pids(MARKER, env=f"PORT={endpoint.rsplit(':', 1)[1]}")


def server_pid(endpoint: str) -> int:
    """The host pid of the replica's Python server itself."""
    found = [pid for pid in replica(endpoint)
             if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode()]
    assert len(found) == 1, (endpoint, found)
    return found[0]


def get(endpoint: str, path: str = "/pid", timeout: float = 2.0) -> requests.Response:
    return requests.get(f"http://{endpoint}{path}", timeout=timeout)


def endpoints_of(cluster, job_id: int) -> list:
    return [t["endpoint"] for t in cluster.current_tasks(job_id)]


def test_cli_service_two_replicas_restart_and_cancel(cluster, service_cmd):
    r = cluster.cli("submit", "--service", "--replicas", "2", "--name", "web", "--", *service_cmd, timeout=30)
    assert r.returncode == 0, r.stderr + cluster.logs()
    lines = r.stdout.split()
    job_id, endpoints = int(lines[0]), lines[1:]
    assert len(endpoints) == 2 and all(e.startswith("127.0.0.1:") for e in endpoints)
    tasks = cluster.current_tasks(job_id)
    assert len({t["worker_id"] for t in tasks}) == 2  # one replica per worker
    assert endpoints == [t["endpoint"] for t in tasks]
    pids = [server_pid(e) for e in endpoints]

    # Kill replica 0's process: the worker restarts it on a new port and reports the new endpoint.
    os.kill(pids[0], signal.SIGKILL)
    fresh = wait_for(lambda: (lambda e: e[0] and e[0] != endpoints[0] and e)(endpoints_of(cluster, job_id)),
                     15, "replica 0 to come back on a new endpoint")
    assert fresh[1] == endpoints[1]
    assert server_pid(fresh[0]) != pids[0]
    assert cluster.current_tasks(job_id)[0]["restarts"] == 1
    assert "restart 1" in cluster.log_text(job_id)
    status = cluster.cli("job", "status", str(job_id)).stdout
    assert f"endpoint={fresh[0]}" in status and f"endpoint={fresh[1]}" in status

    pids = [pid for e in fresh for pid in replica(e)]
    r = cluster.cli("job", "cancel", str(job_id))
    assert r.returncode == 0 and "cancelled" in r.stdout
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, "both replicas' processes to be gone")
    wait_for(lambda: all(t["state"] == "cancelled" for t in cluster.current_tasks(job_id)), 10,
             "both tasks to end cancelled")
    assert cluster.job(job_id)["state"] == "cancelled"


def test_python_client_endpoints_and_health_check_restart(cluster, service_cmd):
    import gpulayer as gl

    client = cluster.client()
    spec = gl.service(service_cmd, replicas=2, health_path="/healthz")
    spec["service"]["health"].update(interval_s=0.2, failures=2)
    job = client.submit(spec)
    try:
        endpoints = job.endpoints(wait=15)
        assert len(endpoints) == 2
        assert all(get(e, "/healthz").status_code == 200 for e in endpoints)
        before = replica(endpoints[1])
        assert before, endpoints[1]
        get(endpoints[1], "/sick")  # /healthz now answers 500: the worker restarts the replica
        wait_for(lambda: not any(pid_alive(p) for p in before), 10, "the sick replica to be stopped")
        fresh = wait_for(lambda: (lambda e: e[1] != endpoints[1] and len(e) == 2 and e)(job.endpoints(wait=15)),
                         15, "replica 1 to report a new endpoint")
        assert fresh[0] == endpoints[0]
        assert get(fresh[1], "/healthz").status_code == 200
        assert "health check failed" in cluster.log_text(job.id)
    finally:
        job.cancel()


def test_endpoints_wait_times_out_clearly(cluster):
    import gpulayer as gl
    from gpulayer.client.errors import WaitTimeout

    job = cluster.client().submit(gl.service([sys.executable, "-c", "import time; time.sleep(60)"], replicas=2))
    try:
        with pytest.raises(WaitTimeout, match="endpoint"):
            job.endpoints(wait=1)
    finally:
        job.cancel()


def test_on_failure_clean_exit_ends_the_service_succeeded(cluster, service_cmd):
    r = cluster.cli("submit", "--service", "--replicas", "2", "--restart", "on_failure", "--", *service_cmd,
                    timeout=30)
    assert r.returncode == 0, r.stderr
    job_id, endpoints = int(r.stdout.split()[0]), r.stdout.split()[1:]
    pids = [pid for e in endpoints for pid in replica(e)]
    get(endpoints[0], "/exit")
    wait_for(lambda: cluster.job(job_id)["state"] != "running", 10, "the service to end")
    info = cluster.job(job_id)
    assert info["state"] == "succeeded" and info["exit_code"] == 0, info
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, "the other replica to be stopped")
    assert "service ended" in cluster.log_text(job_id)
