"""Fault-injection tooling shared by tests/faults and scripts/chaos.py: the invariants a state file
must keep whatever happened to it, and a simulated fleet that talks the worker protocol.

The control plane process that tests kill and restart is gpulayer.testing.ControlPlaneProcess.
`check_state(path)` runs every block of invariants.sql (each returns the rows
that break it) and replays the event log (`replay`) for what needs ordering.
It returns a list of human-readable violations: empty means every invariant held.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import apsw
import requests

REPO = Path(__file__).resolve().parents[1]
PROTO = {"X-GpuLayer-Protocol": "1"}
sys.path.insert(0, str(REPO))
from gpulayer.server.store.queries import load  # noqa: E402

INVARIANTS = load(Path(__file__).with_name("invariants.sql"))
# Events that end a task's hold on its worker (see replay): task_requeued is a requeued task's finish
# (`job requeue`), or a task given back to the queue (a drain's deadline, an element leased ahead).
TASK_ENDS = ("task_finished", "task_lost", "task_cancelled", "task_stopped", "task_requeued")


# -- invariants ---------------------------------------------------------------

def _connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(f"file:{path}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    conn.set_busy_timeout(10_000)
    conn.row_trace = lambda cur, values: dict(zip([d[0] for d in cur.get_description()], values))
    return conn


def check_state(path: Path, *, acknowledged: set[int] = frozenset()) -> list[str]:
    """Every invariant of invariants.sql and of the event replay; the violations found."""
    conn = _connect(Path(path))
    try:
        problems = []
        with conn:  # one read snapshot for every check
            integrity = [r["integrity_check"] for r in conn.execute(INVARIANTS["integrity"])]
            if integrity != ["ok"]:
                problems.append(f"integrity_check: {integrity[:5]}")
            for name, sql in INVARIANTS.items():
                if name in ("integrity", "events_for_replay"):
                    continue
                bad = list(conn.execute(sql))
                if bad:
                    problems.append(f"{name}: {len(bad)} row(s), e.g. {bad[:3]}")
            if acknowledged:
                ids = {r["id"] for r in conn.execute("SELECT id FROM jobs")}
                missing = sorted(set(acknowledged) - ids)
                if missing:
                    problems.append(f"acknowledged_job_missing: {len(missing)} job(s), e.g. {missing[:10]}")
            problems += replay(conn.execute(INVARIANTS["events_for_replay"]))
        return problems
    finally:
        conn.close()


def replay(events) -> list[str]:
    """Walk the event log in order: no replica has two active copies, no worker leaves holding a task.

    A task is held from its task_assigned event to the first of TASK_ENDS or its
    gang's gang_released. At worker_offline or worker_gone the worker must hold
    nothing (its leases ended in the same transaction, listed just before).
    """
    problems: list[str] = []
    holder: dict[int, int] = {}                                  # task -> worker
    replica: dict[int, tuple[int, int]] = {}                     # task -> (job, attempt)
    active: dict[int, set[int]] = defaultdict(set)               # job -> tasks held
    for e in events:
        kind, task, worker, job = e["kind"], e["task_id"], e["worker_id"], e["job_id"]
        data = json.loads(e["data"] or "{}")
        if kind == "task_assigned":
            # an array's elements (`element` in the event) each count their own attempts
            others = {t for t in active[job] if replica[t][1] != data.get("attempt")} if "element" not in data else set()
            if others:
                problems.append(f"two_running_attempts: job {job} task {task} (attempt {data.get('attempt')}) "
                                f"assigned while task(s) {sorted(others)} of another attempt still held "
                                f"(event {e['seq']})")
            holder[task] = worker
            replica[task] = (job, data.get("attempt"))
            active[job].add(task)
        elif kind in TASK_ENDS and task in holder:
            holder.pop(task)
            active[job].discard(task)
        elif kind == "gang_released":
            for t in [t for t in active[job] if replica[t][1] == data.get("attempt")]:
                holder.pop(t, None)
                active[job].discard(t)
        elif kind in ("worker_offline", "worker_gone"):
            held = sorted(t for t, w in holder.items() if w == worker)
            if held:
                problems.append(f"lease_outlived_worker: worker {worker} went {kind.split('_')[1]} holding "
                                f"task(s) {held} (event {e['seq']})")
    return problems


def job_states(path: Path) -> dict[str, int]:
    """How many jobs are in each state."""
    conn = _connect(Path(path))
    try:
        return {r["state"]: r["n"] for r in conn.execute("SELECT state, count(*) AS n FROM jobs GROUP BY state")}
    finally:
        conn.close()


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


# -- simulated fleet -------------------------------------------------------------

class Recorder:
    """Latencies (seconds) by operation, and counters, of one process's clients."""

    def __init__(self):
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.count: dict[str, int] = defaultdict(int)

    def timed(self, op: str, fn, *args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.latency[op].append(time.perf_counter() - began)

    def merge(self, other: dict) -> None:
        for op, values in other["latency"].items():
            self.latency[op].extend(values)
        for key, n in other["count"].items():
            self.count[key] += n

    def as_dict(self) -> dict:
        return {"latency": dict(self.latency), "count": dict(self.count)}


class SimWorker:
    """A worker agent reduced to its protocol: plain HTTP calls, no processes run.

    `step()` does what is due (heartbeat, acquire, start, finish) and returns
    how long to sleep. `die()` stops it without a word, as SIGKILL would.
    """

    def __init__(self, url: str, join_token: str, name: str, rec: Recorder, *, verify=True, rng=None,
                 run_s=(0.05, 0.5), fail_rate: float = 0.05, slots: int = 1):
        import random
        self.url, self.join_token, self.name, self.rec = url, join_token, name, rec
        self.rng = rng or random.Random()
        self.run_s, self.fail_rate, self.slots = run_s, fail_rate, slots
        self.http = requests.Session()
        self.http.verify = verify
        self.http.trust_env = False  # $REQUESTS_CA_BUNDLE would override verify
        self.headers = dict(PROTO)
        self.worker_id = None
        self.interval = 1.0
        self.next_heartbeat = 0.0
        self.current: dict | None = None      # {"task_id", "ends_at", "started"}

    def call(self, op: str, path: str, body: dict | None = None, timeout: float = 10.0) -> requests.Response:
        r = self.rec.timed(op, self.http.post, f"{self.url}/v1{path}", json=body or {}, headers=self.headers,
                           timeout=timeout)
        self.rec.count[f"{op}_{r.status_code}"] += 1
        if r.status_code >= 500:
            self.rec.count["server_errors"] += 1
        return r

    def register(self) -> None:
        self.headers["Authorization"] = f"Bearer {self.join_token}"
        r = self.call("register", "/workers/register", {
            "name": self.name, "labels": {}, "version": "sim", "slots": self.slots,
            "resources": {"cpus": 4, "gpus": 0, "memory_mb": 4096, "gpu_models": []}})
        r.raise_for_status()
        answer = r.json()
        self.worker_id = answer["worker_id"]
        self.headers["Authorization"] = f"Bearer {answer['session_token']}"
        self.interval = float(answer["heartbeat_interval_s"])

    def step(self, acquire_wait_s: float = 0.5) -> float:
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.heartbeat()
            self.next_heartbeat = now + self.interval
        if self.current is None:
            self.acquire(min(acquire_wait_s, max(0.0, self.next_heartbeat - time.monotonic())))
            return 0.0 if self.current else 0.05
        if time.monotonic() >= self.current["ends_at"]:
            failed = self.rng.random() < self.fail_rate
            self.finish("failed" if failed else "succeeded", 1 if failed else 0)
            return 0.0
        return max(0.0, min(self.next_heartbeat, self.current["ends_at"]) - time.monotonic())

    def heartbeat(self) -> None:
        tasks = [{"task_id": self.current["task_id"], "state": "running", "endpoint": None, "restarts": 0}] \
            if self.current and self.current["started"] else []
        r = self.call("heartbeat", "/worker/heartbeat", {"tasks": tasks})
        if r.ok and self.current and self.current["task_id"] in r.json().get("cancel_task_ids", []):
            self.finish("cancelled", None)

    def acquire(self, wait_s: float) -> None:
        began = time.perf_counter()
        r = self.call("acquire", "/worker/acquire", {"wait_s": round(wait_s, 3)}, timeout=wait_s + 10)
        task = r.json().get("task") if r.ok else None
        if not task:
            return
        # "acquire" includes long-polls that waited for work; this is the time to get a task when one was there
        self.rec.latency["acquire_hit"].append(time.perf_counter() - began)
        started = self.call("start", f"/worker/tasks/{task['task_id']}/start", {"pid": 4242})
        if started.status_code == 409:   # cancelled between acquire and start
            return
        self.current = {"task_id": task["task_id"], "started": started.ok,
                        "ends_at": time.monotonic() + self.rng.uniform(*self.run_s)}

    def finish(self, outcome: str, exit_code) -> None:
        r = self.call("finish", f"/worker/tasks/{self.current['task_id']}/finish",
                      {"outcome": outcome, "exit_code": exit_code})
        if r.status_code >= 500:
            return  # as the agent does (agent/link/transport.py): a 5xx is retried, here at the next step
        if r.ok:
            self.rec.count["finished_accepted" if r.json()["accepted"] else "finished_late"] += 1
        self.current = None

    def deregister(self) -> None:
        self.call("deregister", "/worker/deregister", {})

    def die(self) -> None:
        """Vanish without deregistering or finishing (the process was SIGKILLed)."""
        self.rec.count["workers_killed"] += 1
        self.http.close()


def submit_storm(url: str, token: str, stop, acked: list, rec: Recorder, *, verify=True, spec=None,
                 cancel_rate: float = 0.0, pause_s=(0.0, 0.0), rng=None) -> None:
    """Submit jobs until `stop` is set; append each acknowledged (201) job id to `acked`.

    Connection errors (the server is down) are counted and retried. With
    `cancel_rate`, that share of submits is followed by a cancel of a random
    acknowledged job.
    """
    import random
    rng = rng or random.Random()
    http = requests.Session()
    http.verify = verify
    http.trust_env = False
    headers = {"Authorization": f"Bearer {token}"}
    body = spec or {"command": ["true"], "retry": {"max_attempts": 3}}
    while not stop.is_set():
        try:
            r = rec.timed("submit", http.post, f"{url}/v1/jobs", json=body, headers=headers, timeout=10)
            rec.count[f"submit_{r.status_code}"] += 1
            if r.status_code == 201:
                acked.append(r.json()["id"])
            if acked and rng.random() < cancel_rate:
                job = rng.choice(acked)
                c = rec.timed("cancel", http.post, f"{url}/v1/jobs/{job}/cancel", headers=headers, timeout=10)
                rec.count[f"cancel_{c.status_code}"] += 1
        except requests.RequestException:
            rec.count["submit_unreachable"] += 1
            stop.wait(0.05)
        if pause_s[1]:
            stop.wait(rng.uniform(*pause_s))


def storm_main(url: str, token: str, seconds: float, threads: int, out_path: str) -> None:
    """A submitter process: `threads` submit_storm loops for `seconds`; acknowledged ids to out_path, one a line."""
    import threading
    stop = threading.Event()
    lock = threading.Lock()
    out = open(out_path, "a", buffering=1)

    class Sink(list):
        def append(self, job_id):
            super().append(job_id)
            with lock:
                out.write(f"{job_id}\n")

    acked = Sink()
    rec = Recorder()
    loops = [threading.Thread(target=submit_storm, args=(url, token, stop, acked, rec)) for _ in range(threads)]
    for t in loops:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in loops:
        t.join(20)
    out.close()


def sim_fleet(url: str, join_token: str, stop, rec: Recorder, n: int = 3, **options) -> list:
    """`n` SimWorkers stepping on threads until `stop` is set (registering again after a failed call);
    `options` go to SimWorker. The threads, started."""
    import threading

    def run(name):
        worker = SimWorker(url, join_token, name, rec, **options)
        while not stop.is_set():
            try:
                if worker.worker_id is None:
                    worker.register()
                stop.wait(worker.step(acquire_wait_s=0.2))
            except (requests.RequestException, KeyError):
                rec.count["worker_unreachable"] += 1
                stop.wait(0.05)
    threads = [threading.Thread(target=run, args=(f"sim-{i}",), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads

