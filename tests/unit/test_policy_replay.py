"""`gpulayer policy replay` (issue 38 point 5): a small recorded history on a real state file, replayed through
the placement rules with changed settings on in-memory copies; the state file is never changed."""
from __future__ import annotations

import hashlib

import pytest
from helpers import add_worker, job

from gpulayer.server.scheduler import policy_replay as pr
from gpulayer.server.store.db import connect

T0 = 1_000_000.0


def _run(sched, clock, worker_ids, at, until):
    """Move the clock to `at`; every worker of `worker_ids` claims and starts what it is given; returns the tasks."""
    clock.now = at
    taken = []
    for w in worker_ids:
        for claim in sched.acquire_many(w, 0, 4):
            sched.start(w, claim["task_id"], 100)
            taken.append((w, claim["task_id"]))
    clock.now = until
    return taken


def _finish(sched, clock, tasks, at):
    clock.now = at
    for w, task in tasks:
        sched.finish(w, task, exit_code=0, outcome="succeeded", outputs={}, reason=None)


def _backfill(sched, on):
    sched.store.write(lambda c: c.execute("UPDATE scheduler_settings SET backfill = ?", (int(on),)))


def _history(sched, clock):
    """Two 4-GPU workers. A (4 GPUs, 100 s) from T0; at T0+1 a 2-node gang G (4 GPUs each, 50 s); at T0+2 a small S
    (4 GPUs, 300 s). As it happened (greedy: backfill was off then): S took the free worker at once, G waited for it
    until T0+302. Backfill is on again after (the baseline replays with the settings as they are)."""
    _backfill(sched, False)
    clock.now = T0 - 10
    w1, w2 = add_worker(sched, "w1", gpus=4), add_worker(sched, "w2", gpus=4)
    clock.now = T0
    sched.submit(job(name="a", gpus=4, timeout_seconds=100))
    a = _run(sched, clock, [w1], T0, T0)
    clock.now = T0 + 1
    sched.submit(job(name="gang", gpus=4, nodes=2, timeout_seconds=1000))
    clock.now = T0 + 2
    sched.submit(job(name="s", gpus=4, timeout_seconds=300))
    s = _run(sched, clock, [w2], T0 + 2, T0 + 2)
    _finish(sched, clock, a, T0 + 100)
    _finish(sched, clock, s, T0 + 302)
    g = _run(sched, clock, [w1, w2], T0 + 302, T0 + 302)
    assert len(g) == 2
    _finish(sched, clock, g, T0 + 352)
    _backfill(sched, True)


def _report(config, changes, since=T0 - 60, until=T0 + 400):
    conn = connect(config.layout.state, readonly=True)
    try:
        parsed = [pr.parse_change(c, pr.project_names(conn)) for c in changes]
        return pr.policy_replay(conn, since, until, parsed)
    finally:
        conn.close()


def _wait(report, name):
    return next(j for j in report["changed_most"] if j["name"] == name)


def test_backfill_off_makes_the_gang_wait_behind_the_small_job(sched, clock, config):
    _history(sched, clock)
    report = _report(config, ["backfill=off"])
    assert report["window"] == {"since": T0 - 60, "until": T0 + 400, "jobs": 3, "workers": 2, "gpus": 8,
                                "last_recorded_end": T0 + 302}
    gang = _wait(report, "gang")
    # backfill on (the baseline): G holds a reservation from A's expected end (T0+100); S (300 s) may not use
    # the free worker in front of it. Off: S takes it at once and G starts when S ends (T0+302).
    assert (gang["actual_wait_s"], gang["baseline_wait_s"], gang["changed_wait_s"]) == (301, 99, 301)
    assert gang["delta_s"] == 202
    small = _wait(report, "s")
    assert (small["baseline_wait_s"], small["changed_wait_s"]) == (148, 0)
    runs = report["runs"]
    assert runs["baseline"]["worst_wait_s"] == 148 and runs["changed"]["worst_wait_s"] == 301
    assert runs["actual"]["worst_wait_s"] == 301
    # 4x100 + 8x50 + 4x300 GPU-seconds, all inside the window, but in the baseline S runs from T0+150 to
    # T0+450: 50 s of it are past the window's end (T0+400), not counted
    for name, used in (("actual", 2000), ("baseline", 1800), ("changed", 2000)):
        assert runs[name]["gpu_hours"] == {"default": pytest.approx(used / 3600, abs=1e-4)}
        assert runs[name]["gpu_utilisation"] == pytest.approx(used / (8 * 460))


def _counts(path):
    conn = connect(path, readonly=True)
    try:
        tables = [r["name"] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f'SELECT count(*) AS n FROM "{t}"').fetchall()[0]["n"] for t in tables}
    finally:
        conn.close()


def test_nothing_of_the_state_file_changes(sched, clock, config):
    _history(sched, clock)
    sched.store.close()
    path = config.layout.state
    before, rows = hashlib.sha256(path.read_bytes()).hexdigest(), _counts(path)
    assert rows["jobs"] == 3 and rows["usage"] == 4
    _report(config, ["backfill=off", "quota.default=4", "priority_class.high=50", "fairshare_half_life=3600"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert _counts(path) == rows


def _two_projects(sched, clock):
    """One 4-GPU worker, projects vision and nlp (no quotas). At T0 vision queued four 1-GPU jobs of 100 s, at
    T0+1 nlp four: vision's ran T0..T0+100, nlp's T0+100..T0+200."""
    from gpulayer.server.scheduler import teams
    from gpulayer.server.security.auth import Principal
    clock.now = T0 - 10
    w = add_worker(sched, "w1", gpus=4, slots=4)
    people = {}
    for name in ("vision", "nlp"):
        sched.change_teams(teams.add_project, {"name": name})
        uid = sched.change_teams(teams.add_user, f"u-{name}", False, [(name, "member")], None)
        people[name] = Principal(kind="client", jti=f"jti-{name}", name=f"u-{name}", user_id=uid, user=f"u-{name}",
                                 admin=False)
    clock.now = T0
    for _ in range(4):
        sched.submit(job(gpus=1, timeout_seconds=100), people["vision"], "vision")
    first = _run(sched, clock, [w], T0, T0 + 1)
    for _ in range(4):
        sched.submit(job(gpus=1, timeout_seconds=100), people["nlp"], "nlp")
    _finish(sched, clock, first, T0 + 100)
    second = _run(sched, clock, [w], T0 + 100, T0 + 100)
    _finish(sched, clock, second, T0 + 200)


def test_a_quota_moves_gpu_hours_between_projects(sched, clock, config):
    _two_projects(sched, clock)
    report = _report(config, ["quota.vision=1"], until=T0 + 150)
    runs = report["runs"]
    # as it happened and in the baseline: vision 4 GPUs for 100 s, nlp 4 GPUs from T0+100 (50 s in the window)
    for name in ("actual", "baseline"):
        assert runs[name]["gpu_hours"] == {"vision": pytest.approx(400 / 3600, abs=1e-4),
                                           "nlp": pytest.approx(200 / 3600, abs=1e-4)}
    # vision at a 1-GPU quota: one of its jobs at a time; nlp's take the other three GPUs from T0+1 (3 x 100 s).
    # At T0+100 vision's first ends and fair share gives the GPU to nlp's fourth (vision used more): 50 s in
    # the window; vision's second starts when nlp's first three end, T0+101 (49 s)
    assert runs["changed"]["gpu_hours"] == {"vision": pytest.approx(149 / 3600, abs=1e-4),
                                            "nlp": pytest.approx(350 / 3600, abs=1e-4)}
    moved = report["changed_most"]
    assert moved[0]["project"] == "vision" and moved[0]["delta_s"] > 0   # its last job waits for the others
    assert [j["delta_s"] for j in moved if j["project"] == "nlp"] == [-99, -99, -99]  # the fourth: no change


@pytest.mark.parametrize("setting, message", [
    ("bogus=1", "unknown setting 'bogus'"),
    ("quota.default=-1", "quota.default='-1': must be at least 0"),
    ("quota.nope=4", "no project named 'nope'"),
    ("weight.default=0", "must be more than 0"),
    ("backfill=maybe", "expected on or off"),
    ("backfill_depth=0", "must be from 1 to 100"),
    ("priority_class.urgent=5", "no priority class named 'urgent'"),
    ("fairshare_half_life=-5", "must be more than 0 seconds"),
    ("backfill", "expected KEY=VALUE"),
])
def test_bad_settings_are_refused(config, setting, message):
    conn = connect(config.layout.state, readonly=True)
    try:
        with pytest.raises(pr.ReplayError, match=message.replace("(", r"\(").replace(")", r"\)")):
            pr.parse_change(setting, pr.project_names(conn))
    finally:
        conn.close()


def test_a_window_without_recorded_jobs_is_refused(sched, clock, config):
    _history(sched, clock)
    with pytest.raises(pr.ReplayError, match="no recorded jobs in the window"):
        _report(config, [], since=T0 + 1000, until=T0 + 2000)


def test_a_priority_class_moved_reorders_the_queue(sched, clock, config):
    """One 4-GPU worker busy until T0+100; a normal job queued at T0+1, a high one (10) at T0+2. As they are the
    high one goes first; with priority_class.high=-20 the normal one does."""
    clock.now = T0 - 10
    w = add_worker(sched, "w1", gpus=4)
    clock.now = T0
    sched.submit(job(name="x", gpus=4, timeout_seconds=100))
    x = _run(sched, clock, [w], T0, T0 + 1)
    sched.submit(job(name="normal", gpus=4, timeout_seconds=100))
    clock.now = T0 + 2
    sched.submit(job(name="high", gpus=4, timeout_seconds=100, priority="high"))
    _finish(sched, clock, x, T0 + 100)
    h = _run(sched, clock, [w], T0 + 100, T0 + 100)
    _finish(sched, clock, h, T0 + 200)
    n = _run(sched, clock, [w], T0 + 200, T0 + 200)
    _finish(sched, clock, n, T0 + 300)
    report = _report(config, ["priority_class.high=-20"])
    waits = {j["name"]: (j["actual_wait_s"], j["baseline_wait_s"], j["changed_wait_s"]) for j in report["changed_most"]}
    assert waits == {"high": (98, 98, 198), "normal": (199, 199, 99)}
