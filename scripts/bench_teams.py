"""What the teams checks (issue 15) cost on the client request path, in one sitting.

The real app over a real state file, in process (falcon's test client: no sockets, so the
figures are the server's own work): submit, read a job, read its logs, list 100 jobs, each
with server init's token (the first admin, as every existing setup calls). Rounds alternate
between the app as it is and the same app with the teams work bypassed (the job access check,
the owner/project annotation and redaction, the submit's project choice replaced by no-ops),
so the ratio is what ownership adds, measured against itself:

    python scripts/bench_teams.py --jobs 300 --rounds 6 --json

and, with `--list-jobs N` (200,000 by default), the page of `job list` for a user with few of N
jobs and for the admin with most of them: through the owner's index against the general query.

Nothing is timed as a test: this prints figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import PROTOCOL_HEADER, table  # noqa: E402

CALLS = ("submit", "get_job", "logs", "list_100")


def _bypass(teams, jobs, views):
    """No-op stand-ins for what teams adds to these calls; returns a function that puts them back."""
    saved = [(module, name, getattr(module, name))
             for module, name in ((teams, "check_job"), (teams, "submit"), (views, "annotate"), (views, "job"))]
    render = views.render
    teams.check_job = lambda conn, principal, job_id, need: {"id": job_id, "owner": None, "project": None,
                                                             "level": "manage"}
    teams.submit = lambda conn, principal, project, spec, now: jobs.submit(conn, spec, now)
    views.annotate = lambda conn, rendered, principal=None: rendered
    views.job = lambda conn, principal, job_id, index=None: render(conn, job_id, index)

    def restore():
        for module, name, fn in saved:
            setattr(module, name, fn)
    return restore


def run(jobs_per_round: int, rounds: int) -> dict:
    import falcon.testing

    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.http.app import create_app, new_deps
    from gpulayer.server.scheduler import jobs, teams, views
    from gpulayer.server.security.auth import init_home

    home = Path(tempfile.mkdtemp(prefix="bench-teams-")) / "home"
    token = init_home(home)["client_token"]
    deps = new_deps(ControlPlaneConfig(home=home))
    api = falcon.testing.TestClient(create_app(deps))
    headers = {"Authorization": f"Bearer {token}", **PROTOCOL_HEADER}
    found: dict[str, dict[str, list[float]]] = {mode: {c: [] for c in CALLS} for mode in ("teams", "bypassed")}

    def timed(mode: str, call: str, method: str, path: str, **kwargs):
        start = time.perf_counter()
        answer = api.simulate_request(method, path, headers=headers, **kwargs)
        found[mode][call].append(time.perf_counter() - start)
        assert answer.status_code < 300, answer.text
        return answer

    try:
        for r in range(rounds):
            mode = "teams" if r % 2 == 0 else "bypassed"
            restore = _bypass(teams, jobs, views) if mode == "bypassed" else (lambda: None)
            try:
                spec = {"command": ["true"], "labels": {"pool": "nowhere"}}  # queued for good: no such worker
                ids = [timed(mode, "submit", "POST", "/v1/jobs", json=spec).json["id"] for _ in range(jobs_per_round)]
                for job_id in ids:
                    timed(mode, "get_job", "GET", f"/v1/jobs/{job_id}")
                    timed(mode, "logs", "GET", f"/v1/jobs/{job_id}/logs")
                for _ in range(max(1, jobs_per_round // 10)):
                    timed(mode, "list_100", "GET", "/v1/jobs?limit=100")
            finally:
                restore()
    finally:
        deps.store.close()
    rows = []
    for call in CALLS:
        with_teams, without = statistics.median(found["teams"][call]), statistics.median(found["bypassed"][call])
        rows.append({"call": call, "n": len(found["teams"][call]), "teams_p50_ms": round(with_teams * 1e3, 3),
                     "bypassed_p50_ms": round(without * 1e3, 3), "ratio": round(with_teams / without, 3)})
    return {"jobs_per_round": jobs_per_round, "rounds": rounds, "calls": rows}


def owner_listing(total: int, mine_every: int = 4000, calls: int = 5) -> list[dict]:
    """The page of one user's jobs among `total` (every `mine_every`-th is theirs): the query through the
    owner's index (list_jobs_of_owner) against the general one (list_jobs, a backward scan), medians."""
    from gpulayer.server.store import db
    from gpulayer.server.store.queries import QUERIES

    conn = db.connect(Path(tempfile.mkdtemp(prefix="bench-teams-")) / "state.db")
    db.ensure_schema(conn)
    conn.execute("INSERT INTO users (id, name, created_at) VALUES (2, 'bob', 1)")
    with conn:
        conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :total) "
                     "INSERT INTO jobs (spec, state, finished_at, created_at, user_id) "
                     "SELECT '{}', 'succeeded', 2, 1, CASE WHEN i % :every = 0 THEN 2 ELSE 1 END FROM n",
                     {"total": total, "every": mine_every})
    found = []
    for who, owner, viewer in (("bob (few)", 2, 2), ("admin (most)", 1, None)):
        row = {"owner": who, "jobs": total}
        for query in ("list_jobs", "list_jobs_of_owner"):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                conn.execute(QUERIES[query], {"state": None, "name": None, "since": None, "before": None, "owner_id": owner, "project_id": None,
                                              "viewer_id": viewer, "limit": 100}).fetchall()
                times.append(time.perf_counter() - start)
            row[f"{query}_p50_ms"] = round(statistics.median(times) * 1e3, 2)
        found.append(row)
    conn.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300, help="jobs submitted (and read) per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, alternating teams / bypassed")
    parser.add_argument("--list-jobs", type=int, default=200_000,
                        help="jobs in the state file of the `job list` query comparison (0: skip it)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    result = run(args.jobs, args.rounds)
    if args.list_jobs:
        result["owner_listing"] = owner_listing(args.list_jobs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result["calls"]))
        if args.list_jobs:
            print()
            print(table(result["owner_listing"]))


if __name__ == "__main__":
    main()
