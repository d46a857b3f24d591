#!/usr/bin/env python3
"""GPUlayer against Slurm on this machine: trivial jobs, at most 2 at a time, in one run.

1. Slurm with Debian's default scheduler settings: a single-node cluster on
   loopback (tests/slurm/localslurm.py; node CPUs=2, every job `-c1`, so at most
   2 run at once), --default-jobs jobs through `sbatch`, until `squeue` is empty.
2. The same cluster tuned as Slurm's high-throughput guide advises
   (`SchedulerParameters=batch_sched_delay=0,sched_min_interval=0`, `Epilog=/bin/true`,
   quiet daemon logs), --jobs jobs.
3. GPUlayer: a real server subprocess and one real worker subprocess
   (`gpulayer worker start --parallel 2`), --jobs jobs through POST /v1/jobs,
   until every job has finished.

Every job is the same one-liner, `date +%s.%N > <dir>/<i>`: `true` that also
writes when it started. Submit-to-start is that stamp minus the time taken just
before the client's submit call (sbatch, or POST /v1/jobs); jobs/s is the job
count over the time from the first submit to the queue being empty. Jobs are
submitted one after another by one client, while earlier ones run.

    python scripts/bench_vs_slurm.py [--jobs 500] [--default-jobs 100] [--write-docs]

With `--array N` it compares job arrays instead: one `sbatch --array=0-(N-1)` on the
tuned cluster against one GPUlayer array of N elements (`POST /v1/jobs` with `array`),
each element the same one-liner writing `$SLURM_ARRAY_TASK_ID` / `$GPULAYER_ARRAY_INDEX`,
from the one submit until every element has ended (its own section of the docs).

Needs root and Debian's Slurm (installed with apt-get when missing).
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "slurm"))
import benchlib  # noqa: E402
from localslurm import LocalSlurm, ensure_installed  # noqa: E402

TUNED = ["SchedulerParameters=batch_sched_delay=0,sched_min_interval=0", "Epilog=/bin/true",
         "SlurmctldDebug=error", "SlurmdDebug=error"]
SECTION = "## GPUlayer vs Slurm"
ARRAY_SECTION = "## Job arrays vs Slurm"


def stamp_command(stamps: Path, i: int) -> str:
    return f"date +%s.%N > {stamps / str(i)}"


def latencies(stamps: Path, submitted: dict[int, float]) -> list[float]:
    out = []
    for i, at in submitted.items():
        path = stamps / str(i)
        if not path.exists() or not path.read_text().strip():
            raise RuntimeError(f"job {i} left no start stamp in {path}")
        out.append(float(path.read_text()) - at)
    return out


def result(name: str, n: int, wall: float, lat: list[float], note: str = "") -> dict:
    return {"run": name, "jobs": n, "wall_s": round(wall, 2), "jobs_per_s": round(n / wall, 2),
            "start_p50_s": round(benchlib.percentile(lat, 50), 4), "start_p99_s": round(benchlib.percentile(lat, 99), 4),
            "note": note}


def through_slurm(name: str, n: int, extra: list[str], submit) -> dict:
    """`submit(cluster, root, stamps)` on a fresh single-node Slurm returns {i: submitted at}; then until
    `squeue` is empty."""
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    stamps = root / "stamps"
    stamps.mkdir()
    cluster = LocalSlurm(root, cpus=2, extra=extra).start()
    try:
        first = time.time()
        submitted = submit(cluster, root, stamps)
        while cluster.queue():
            time.sleep(0.05)
        wall = time.time() - first
        return result(name, n, wall, latencies(stamps, submitted))
    finally:
        cluster.stop()


def run_slurm(name: str, n: int, extra: list[str]) -> dict:
    def submit(cluster, root: Path, stamps: Path) -> dict[int, float]:
        submitted: dict[int, float] = {}
        for i in range(n):
            submitted[i] = time.time()
            cluster.run("sbatch", "-Q", "-c1", "-J", "bench", "--output=/dev/null", "--wrap", stamp_command(stamps, i),
                        cwd=root)
        return submitted
    return through_slurm(name, n, extra, submit)


def run_slurm_array(n: int, extra: list[str]) -> dict:
    """One `sbatch --array=0-(n-1)`: from the submit until `squeue` is empty."""
    def submit(cluster, root: Path, stamps: Path) -> dict[int, float]:
        at = time.time()
        cluster.run("sbatch", "-Q", "-c1", "-J", "bench", f"--array=0-{n - 1}", "--output=/dev/null", "--wrap",
                    f"date +%s.%N > {stamps}/$SLURM_ARRAY_TASK_ID", cwd=root)
        return dict.fromkeys(range(n), at)
    return through_slurm(f"Slurm --array=0-{n - 1}, tuned", n, extra, submit)


SANDBOX = {"mode": "auto"}  # the worker's --sandbox (main's --sandbox): the default, or none for its share


def through_gpulayer(name: str, n: int, submit) -> dict:
    """`submit(post, stamps)` (post: POST /v1/jobs of a JobSpec) to a real server with one worker
    (--parallel 2) returns {i: submitted at}; then until every job has finished, each succeeded."""
    stamps = Path(tempfile.mkdtemp(prefix="bench-gpulayer-"))
    stamps.chmod(0o777)  # the sandbox's task user writes the stamps: the folder is bound into every task
    with benchlib.Server() as srv:
        worker = srv.start_worker("bench", parallel=2, args=["--sandbox", SANDBOX["mode"], "--sandbox-bind", str(stamps)])
        try:
            s = benchlib.session(srv.verify)
            headers = srv.client_headers()
            db = sqlite3.connect(f"file:{srv.state}?mode=ro", uri=True)
            first = time.time()
            submitted = submit(lambda spec: s.post(srv.url + "/v1/jobs", headers=headers, json=spec).raise_for_status(),
                               stamps)
            while db.execute("SELECT count(*) FROM jobs WHERE finished_at IS NULL").fetchone()[0]:
                time.sleep(0.01)
            wall = time.time() - first
            failed = db.execute("SELECT count(*) FROM jobs WHERE state <> 'succeeded'").fetchone()[0]
            db.close()
            if failed:
                raise RuntimeError(f"{failed} GPUlayer jobs did not succeed")
            return result(name, n, wall, latencies(stamps, submitted))
        finally:
            worker.stop()


def run_gpulayer(n: int) -> dict:
    def submit(post, stamps: Path) -> dict[int, float]:
        submitted: dict[int, float] = {}
        for i in range(n):
            submitted[i] = time.time()
            post({"command": ["sh", "-c", stamp_command(stamps, i)]})
        return submitted
    return through_gpulayer(f"GPUlayer, 1 worker --parallel 2 --sandbox {SANDBOX['mode']}", n, submit)


def run_gpulayer_array(n: int) -> dict:
    """One GPUlayer array of n elements: from the POST until it ended."""
    def submit(post, stamps: Path) -> dict[int, float]:
        at = time.time()
        post({"command": ["sh", "-c", f"date +%s.%N > {stamps}/$GPULAYER_ARRAY_INDEX"], "array": f"0-{n - 1}"})
        return dict.fromkeys(range(n), at)
    return through_gpulayer(f"GPUlayer array of {n}, 1 worker --parallel 2", n, submit)


def table_rows(runs: list[dict], what: str = "jobs") -> list[str]:
    """The runs as a markdown table."""
    return [f"| run | {what} | wall (s) | {what}/s | submit-to-start p50 (s) | p99 (s) |", "|---|---|---|---|---|---|",
            *(f"| {r['run']} | {r['jobs']} | {r['wall_s']} | {r['jobs_per_s']} | {r['start_p50_s']} | "
              f"{r['start_p99_s']} |" for r in runs)]


def array_markdown(runs: list[dict], args, machine: str) -> str:
    slurm, ours = runs
    rows = table_rows(runs, "elements")
    return "\n".join([
        ARRAY_SECTION, "",
        "One job array of trivial elements, at most 2 at a time, on one machine, in one run of",
        "`python scripts/bench_vs_slurm.py " + " ".join(args) + "` (as root). Slurm: the single-node",
        "cluster on loopback tuned for throughput as above, one `sbatch -c1 --array=0-N`; GPUlayer: a real",
        "server and one worker `--parallel 2`, one `POST /v1/jobs` with `array`. Each element writes",
        "`date +%s.%N` to a file named by its index: submit-to-start is that stamp minus the time just before",
        "the one submit; wall is from the submit until every element has ended.",
        "", machine, "", *rows, "",
        f"- GPUlayer over tuned Slurm, elements/s: {ours['jobs_per_s'] / slurm['jobs_per_s']:.1f}x.",
        "",
    ])


def markdown(runs: list[dict], args, machine: str) -> str:
    default, tuned, ours = runs
    rows = table_rows(runs)
    return "\n".join([
        SECTION, "",
        "Trivial jobs, at most 2 at a time, on one machine, in one run of",
        "`python scripts/bench_vs_slurm.py " + " ".join(args) + "` (as root; it starts a single-node Slurm on",
        "loopback with tests/slurm/localslurm.py, node `CPUs=2`, every job `sbatch -c1`). Each job is",
        "`date +%s.%N > <file>`, `true` that also writes when it started: submit-to-start is that stamp minus",
        "the time just before the client's submit call (`sbatch`, or `POST /v1/jobs`); jobs/s is the count over",
        "the time from the first submit until the queue is empty (`squeue` empty; every GPUlayer job finished).",
        "One client submits the jobs one after another while earlier ones run.",
        "", machine, "",
        *rows, "",
        f"- Default settings: Debian's slurm.conf defaults (`batch_sched_delay` 3 s, `sched_interval` 60 s); "
        f"{default['jobs']} jobs, not {tuned['jobs']}, because at this rate {tuned['jobs']} take over 5 minutes.",
        f"- Tuned per Slurm's high-throughput guide: `{'`, `'.join(TUNED)}`.",
        f"- GPUlayer throughput: {ours['jobs_per_s'] / tuned['jobs_per_s']:.1f}x tuned Slurm, "
        f"{ours['jobs_per_s'] / default['jobs_per_s']:.0f}x default Slurm.",
        f"- Submit-to-start, tuned Slurm over GPUlayer: p50 {tuned['start_p50_s'] / ours['start_p50_s']:.1f}x, "
        f"p99 {tuned['start_p99_s'] / ours['start_p99_s']:.1f}x (default Slurm: p50 "
        f"{default['start_p50_s'] / ours['start_p50_s']:.0f}x, p99 {default['start_p99_s'] / ours['start_p99_s']:.0f}x).",
        "",
    ])


#: Where each section lives in the benchmarks' log (docs/benchmarks/); the headline page's row is a person's.
SECTION_FILES = {SECTION: "early.md", ARRAY_SECTION: "issue-16.md"}


def write_docs(text: str, section: str = SECTION) -> None:
    """Replace (or append) only this section of its file under docs/benchmarks/; other sections are someone else's."""
    path = REPO / "docs" / "benchmarks" / SECTION_FILES[section]
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda m: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500, help="jobs for tuned Slurm and GPUlayer (default 500)")
    parser.add_argument("--default-jobs", type=int, default=100,
                        help="jobs for Slurm's default settings (default 100: 500 take over 5 minutes there)")
    parser.add_argument("--array", type=int, default=None, metavar="N",
                        help="compare one job array of N elements instead (sbatch --array=0-(N-1) vs GPUlayer)")
    parser.add_argument("--write-docs", action="store_true", help="write the figures into their section of docs/benchmarks/ (the log)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--sandbox", choices=("auto", "none"), default="auto",
                        help="the GPUlayer worker's --sandbox (default auto, as `worker start`; none: the sandbox's share)")
    parser.add_argument("--skip-default-slurm", action="store_true",
                        help="leave out Slurm with Debian's defaults (over 2 minutes for 100 jobs)")
    args = parser.parse_args(argv)
    SANDBOX["mode"] = args.sandbox
    # SIGTERM unwinds like Ctrl-C, so the Slurm daemons and the server are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = ensure_installed()
    if reason:
        print(f"bench_vs_slurm: no Slurm: {reason}", file=sys.stderr)
        return 2
    machine = benchlib.machine_line()
    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--write-docs", "--json")]
    if args.array:
        runs = [run_slurm_array(args.array, TUNED), run_gpulayer_array(args.array)]
        text = array_markdown(runs, shown, machine)
        print(json.dumps(runs, indent=2) if args.json else text)
        if args.write_docs:
            write_docs(text, ARRAY_SECTION)
        return 0
    runs = [*([] if args.skip_default_slurm else [run_slurm("Slurm, Debian defaults", args.default_jobs, [])]),
            run_slurm("Slurm, tuned for throughput", args.jobs, TUNED),
            run_gpulayer(args.jobs)]
    text = markdown(runs, shown, machine) if len(runs) == 3 else "\n".join([machine, "", *table_rows(runs)])
    print(json.dumps(runs, indent=2) if args.json else text)
    if args.write_docs and len(runs) == 3:
        write_docs(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
