"""What `GET /v1/jobs/{id}` costs, two trees in one sitting (issue 23, point 2: one read path for jobs).

Each round starts one child process per tree (PYTHONPATH=TREE, so the child imports that tree's
gpulayer), alternating which goes first; the child builds the real app over a real state file, in
process (falcon's test client: no sockets, so the figures are the server's own work), and reads
every job of its state file once per caller:

- `admin`: server init's token, a job with no dependency;
- `owner`: the job's owner (a member of p1 and p2), the job running after one of its p2 jobs;
- `peer`: a member of p1 only, who may only see the job (redacted, the p2 job rendered null).

    python scripts/bench_job_read.py --trees BEFORE AFTER --jobs 200 --rounds 6

prints the median per caller and tree, and the ratio AFTER / BEFORE (medians over all rounds);
`--json` prints them as JSON. With `--choose N` (2,000 by default), each child then submits N more
jobs, 10 of them named sweep-K, and walks `GET /v1/jobs?name=sweep-*` as `job cancel --name` does
(pages of 1,000, the name matched again by the client): a server that filters sends the 10, one
from before the filter sends every job. Nothing is timed as a test: this prints figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
CALLERS = ("admin", "owner", "peer")


def child(jobs: int, choose: int) -> dict:
    """In the tree on sys.path: submit `jobs` jobs per caller's kind, read each once; the seconds per read.
    Then, with `choose`, that many more jobs and 10 named sweep-N: how long `job cancel --name 'sweep-*'`
    takes to choose them (`choose`: [seconds, jobs sent, bytes sent])."""
    import falcon.testing

    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.http.app import create_app, new_deps
    from gpulayer.server.security.auth import init_home

    home = Path(tempfile.mkdtemp(prefix="bench-job-read-")) / "home"
    proto = {"X-GpuLayer-Protocol": "1"}
    admin = {"Authorization": f"Bearer {init_home(home)['client_token']}", **proto}
    deps = new_deps(ControlPlaneConfig(home=home))
    api = falcon.testing.TestClient(create_app(deps))

    def post(path: str, headers: dict, body: dict) -> dict:
        answer = api.simulate_post(path, headers=headers, json=body)
        assert answer.status_code == 201, answer.text
        return answer.json

    def user(name: str, projects: list[str]) -> dict:
        made = post("/v1/users", admin, {"name": name, "projects": [{"project": p, "role": "member"} for p in projects]})
        return {"Authorization": f"Bearer {made['token']}", **proto}

    try:
        for project in ("p1", "p2"):
            post("/v1/projects", admin, {"name": project})
        owner, peer = user("owner", ["p1", "p2"]), user("peer", ["p1"])
        spec = {"command": ["echo", "x"], "env": {"KEY": "v"}, "labels": {"pool": "nowhere"}}  # queued for good
        plain = [post("/v1/jobs", admin, spec)["id"] for _ in range(jobs)]
        after = []
        for _ in range(jobs):
            first = post("/v1/jobs", owner, {**spec, "project": "p2"})["id"]
            after.append(post("/v1/jobs", owner, {**spec, "project": "p1", "after": [{"job": first}]})["id"])
        found: dict[str, list[float]] = {c: [] for c in CALLERS}
        for caller, headers, ids in (("admin", admin, plain), ("owner", owner, after), ("peer", peer, after)):
            api.simulate_get(f"/v1/jobs/{ids[0]}", headers=headers)  # the caller's principal cached
            for job_id in ids:
                start = time.perf_counter()
                answer = api.simulate_get(f"/v1/jobs/{job_id}", headers=headers)
                found[caller].append(time.perf_counter() - start)
                assert answer.status_code == 200, answer.text
        if choose:
            found["choose"] = _choose(api, post, admin, spec, choose)
        return found
    finally:
        deps.store.close()


def _choose(api, post, admin: dict, spec: dict, others: int) -> list[float]:
    """`job cancel --name 'sweep-*'` choosing its jobs among `others` more (selection._matching's walk, pages
    of 1,000, the name matched again here): [seconds, jobs sent, bytes sent]."""
    import fnmatch
    for n in range(others + 10):
        post("/v1/jobs", admin, {**spec, "name": f"sweep-{n}" if n % (others // 10 + 1) == 0 else f"other-{n}"})
    start, sent, size, before, chosen = time.perf_counter(), 0, 0, None, []
    while True:
        params = {"state": "queued", "name": "sweep-*", "limit": 1000, **({"before": before} if before else {})}
        answer = api.simulate_get("/v1/jobs", headers=admin, params=params)
        page = answer.json["jobs"]
        sent, size = sent + len(page), size + len(answer.content)
        chosen += [j["id"] for j in page if fnmatch.fnmatchcase(j["name"] or "", "sweep-*")]
        if len(page) < 1000:
            break
        before = page[-1]["id"]
    assert len(chosen) >= 10, chosen
    return [time.perf_counter() - start, sent, size]


def run(trees: list[str], jobs: int, rounds: int, choose: int = 0) -> dict:
    found: dict = {tree: {c: [] for c in (*CALLERS, "choose")} for tree in trees}
    for r in range(rounds):
        for tree in trees if r % 2 == 0 else list(reversed(trees)):
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            out = subprocess.run([sys.executable, __file__, "--child", "--jobs", str(jobs), "--choose", str(choose)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            for caller, times in json.loads(out).items():
                found[tree][caller].extend(times if caller != "choose" else [times])
    before, after = trees
    rows = []
    for caller in CALLERS:
        old, new = statistics.median(found[before][caller]), statistics.median(found[after][caller])
        rows.append({"caller": caller, "reads": len(found[after][caller]), "before_p50_ms": round(old * 1e3, 3),
                     "after_p50_ms": round(new * 1e3, 3), "ratio": round(new / old, 3)})
    result = {"before": before, "after": after, "jobs": jobs, "rounds": rounds, "reads": rows}
    if choose:
        old, new = ([statistics.median(c[i] for c in found[tree]["choose"]) for i in range(3)]
                    for tree in (before, after))
        result["choose"] = {"jobs": choose + 10, "before_s": round(old[0], 4), "after_s": round(new[0], 4),
                            "ratio": round(new[0] / old[0], 4), "before_jobs_sent": int(old[1]),
                            "after_jobs_sent": int(new[1]), "before_bytes": int(old[2]), "after_bytes": int(new[2])}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs=2, metavar=("BEFORE", "AFTER"), help="two gpulayer checkouts")
    parser.add_argument("--jobs", type=int, default=200, help="jobs read per caller and round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds; each runs both trees, in turn first")
    parser.add_argument("--choose", type=int, default=2000,
                        help="jobs among which `job cancel --name` chooses 10 (0: skip it)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.jobs, args.choose)))
        return
    if not args.trees:
        parser.error("--trees BEFORE AFTER: two checkouts to compare")
    result = run(args.trees, args.jobs, args.rounds, args.choose)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    from benchlib import machine_line, table
    print(machine_line())
    print(f"GET /v1/jobs/{{id}}: {result['before']} -> {result['after']}, {args.jobs} jobs x {args.rounds} rounds")
    print(table(result["reads"]))
    if args.choose:
        print()
        print(table([result["choose"]]))


if __name__ == "__main__":
    main()
