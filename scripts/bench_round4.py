"""What issue 36's security fixes cost (round 4), measured against whichever tree PYTHONPATH names.

Unlike the other scripts this one imports GPUlayer from PYTHONPATH, not from the folder it sits in, so one copy
measures the code before the round and after it (run the two interleaved, on one machine, in one sitting):

    PYTHONPATH=/path/to/tree python3 scripts/bench_round4.py launch [--launches 40]
    PYTHONPATH=/path/to/tree python3 scripts/bench_round4.py verify [--mib 1024] [--rounds 3]
    PYTHONPATH=/path/to/tree python3 scripts/bench_round4.py relay-attack [--seconds 15]
    PYTHONPATH=/path/to/tree python3 scripts/bench_round4.py due-webhooks [--webhooks 1000] [--owners 1] [--looks 200]

- launch: `true` started as a root agent starts it, bare, in a plain task's bwrap (`Sandbox.wrap`) and in a busybox
  image (`agent.sandbox.imagerun.wrap_image`: one root bwrap and setpriv before the round, two bwraps after, the inner in
  its setuid mode as the task user), interleaved; medians (item 1's cost, and a plain task's launch unchanged).
- verify: an artifact cached by an earlier agent (a 1 GiB file named by its digest) as `ArtifactCache.get` finds
  it: the first use in this agent (hashed again after the round), and the second (a stat); the file in the page
  cache; medians over fresh caches (items 2 and 8: the cache checked at use).
- relay-attack: a real control plane and worker (gpulayer.testing); a raw relay client opens two
  `head -c 1G /dev/zero` exec streams on one socket, grants each 2**32-1-256 KiB of window and reads nothing
  (tests/security/test_relay_bounds.py's attack): the control plane's VmRSS before and at its peak over
  `--seconds` (item 3).
- due-webhooks: the outbox's look at due webhooks (the `due_webhooks` query, every tick while webhooks are
  behind) over `--webhooks` webhooks of `--owners` owners, each behind, in a fresh state file of the tree's
  schema: median ms per look, and the rows one look hands out (item 5: the owner's rights joined and a
  per-owner cap ranked in).
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpulayer

TREE = Path(gpulayer.__file__).resolve().parents[1]
sys.path.insert(1, str(TREE / "tests"))  # ociimages, from the tree measured
# Not benchlib: it puts the folder this script sits in first on sys.path, which would measure this tree's agent.
median = statistics.median


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def launch(args: argparse.Namespace, tmp: Path) -> dict:
    """Median ms of `true`: bare, in the plain sandbox, in a busybox image.

    The set-up is bench_images.agent_side's, not imported from it: that module (through benchlib) puts its own
    tree first on sys.path, so it would measure the tree it sits in whatever PYTHONPATH says."""
    from agent.artifacts.cache import ArtifactCache
    from agent.sandbox.imagerun import TASK_DIR, image_environment, wrap_image
    from agent.sandbox.images import ImageCache
    from agent.sandbox.bwrap import resolve
    from gpulayer.protocol.jobspec import ImageSpec
    from ociimages import build_layout, manifest_of

    layout = build_layout(tmp / "image")
    digest, manifest = manifest_of(layout)
    spec = ImageSpec(manifest=digest, ref="bench",
                     blobs=[manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])])

    def fetch(digest, out):
        out.write((layout / "blobs" / "sha256" / digest[7:]).read_bytes())
    cache = tmp / "cache"
    cache.mkdir(mode=0o700)
    prepared = ImageCache(ArtifactCache(cache, 1 << 30, fetch)).prepare(spec, lambda _: None)
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    workdir = tmp / "task"
    workdir.mkdir()
    sandbox.give(workdir)
    in_image, env = wrap_image(sandbox, prepared, ["true"], image_environment(prepared.config), str(workdir),
                               TASK_DIR, gpu_nodes=[], driver=[])
    plain = sandbox.wrap(["true"], str(workdir), gpu_nodes=[])
    spans: dict[str, list[float]] = {"bare": [], "plain": [], "image": []}
    for _ in range(args.launches):
        for kind, argv, argv_env in (("bare", ["true"], None), ("plain", plain, None), ("image", in_image, env)):
            start = time.perf_counter()
            subprocess.run(argv, env=argv_env, check=True, start_new_session=True)
            spans[kind].append(time.perf_counter() - start)
    return {f"{kind}_ms": round(median(values) * 1000, 2) for kind, values in spans.items()} | {
        "image_argv_bwraps": sum(1 for part in in_image if part.endswith("bwrap"))}


def verify(args: argparse.Namespace, tmp: Path) -> dict:
    """Median ms of a cached artifact's first and second `get` in a fresh ArtifactCache, and of sha256 alone."""
    from agent.artifacts.cache import ArtifactCache

    root = tmp / "cache"
    root.mkdir(mode=0o700)
    block = os.urandom(1 << 20)
    hasher = hashlib.sha256()
    with open(tmp / "blob", "wb") as out:
        for _ in range(args.mib):
            out.write(block)
            hasher.update(block)
    hexd = hasher.hexdigest()
    os.rename(tmp / "blob", root / hexd)
    os.chmod(root / hexd, 0o644)
    os.sync()  # no dirty pages left for the first use to wait on

    def fetch(digest, out):
        raise AssertionError("the cached artifact was fetched again")
    first, second, bare = [], [], []
    for _ in range(args.rounds):
        cache = ArtifactCache(root, 1 << 40, fetch)
        for into in (first, second):
            start = time.perf_counter()
            cache.get(f"sha256:{hexd}")
            into.append(time.perf_counter() - start)
        start = time.perf_counter()
        with open(root / hexd, "rb") as handle:
            hashlib.file_digest(handle, "sha256")
        bare.append(time.perf_counter() - start)
    gib = args.mib / 1024
    return {"mib": args.mib, "first_use_ms": round(median(first) * 1000, 2),
            "first_use_s_per_gib": round(median(first) / gib, 3),
            "second_use_ms": round(median(second) * 1000, 3), "sha256_s_per_gib": round(median(bare) / gib, 3)}


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024


def relay_attack(args: argparse.Namespace, tmp: Path) -> dict:
    """The control plane's VmRSS (MiB) before the never-reading client and at its peak over --seconds."""
    from gpulayer.relaylink import wsclient
    from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
    from gpulayer.protocol.relay import DATA, EXT_DATA, INITIAL_WINDOW, MAX_DATA_HEADER, MAX_STREAM_ID, OPEN, WINDOW
    from gpulayer.protocol.relay import decode, encode
    from gpulayer.testing import ControlPlaneProcess, wait_for

    plane = ControlPlaneProcess(tmp / "plane", heartbeat_interval=0.5)
    try:
        plane.start(timeout=120)
        plane.start_worker("w1", parallel=4, timeout=120)
        job_id = plane.submit({"command": ["sleep", "900"], "name": "target"})
        wait_for(lambda: plane.job(job_id)["tasks"][0]["state"] == "running", 60, "the target job to run")
        assert plane.pid is not None
        time.sleep(1)
        before = _rss_mib(plane.pid)
        headers = {"Authorization": f"Bearer {plane.client_token}", PROTOCOL_HEADER: str(PROTOCOL),
                   MAX_DATA_HEADER: "262144"}
        ws = wsclient.connect(f"ws://127.0.0.1:{plane.port}/v1/jobs/{job_id}/relay", headers=headers,
                              ping_interval=None, max_size=1 << 20, timeout=30)
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        for sid in (1, 3):
            ws.send(encode(sid, OPEN, {"kind": "exec", "argv": ["head", "-c", str(1 << 30), "/dev/zero"]}))
            ws.send(encode(sid, WINDOW, MAX_STREAM_ID - INITIAL_WINDOW))
        peak, started = before, time.monotonic()
        while time.monotonic() - started < args.seconds:
            peak = max(peak, _rss_mib(plane.pid))
            time.sleep(0.2)
        got, started = 0, time.monotonic()
        while got < 32 * 1024 * 1024 and time.monotonic() - started < 60:  # the bytes still flow once it reads
            frame = decode(ws.recv(timeout=30), 262144)
            got += frame.cost() if frame.type in (DATA, EXT_DATA) else 0
        read_s = time.monotonic() - started
        ws.close()
        return {"seconds": args.seconds, "rss_before_mib": round(before), "rss_peak_mib": round(peak),
                "growth_mib": round(peak - before), "then_read_32mib_s": round(read_s, 2), "healthy": plane.healthy()}
    finally:
        plane.close()


def due_webhooks(args: argparse.Namespace, tmp: Path) -> dict:
    """Median ms of one `due_webhooks` look over --webhooks webhooks of --owners owners, every one behind."""
    from gpulayer.server.store.db import connect, ensure_schema
    from gpulayer.server.store.queries import rows

    conn = connect(tmp / "state.db")
    ensure_schema(conn)
    now = time.time()
    with conn:
        for user in range(1, args.owners + 1):  # ids past any the schema makes
            conn.execute("INSERT INTO users (id, name, admin, created_at) VALUES (?, ?, 1, ?)",
                         (1000 + user, f"bench{user}", now))
        for index in range(args.webhooks):
            conn.execute("INSERT INTO webhooks (url, events, scope, user_id, cursor, created_at) "
                         "VALUES (?, '[\"job.submitted\"]', 'all', ?, 0, ?)",
                         (f"http://127.0.0.1:9/{index}", 1000 + index % args.owners + 1, now))
    params = {"upto": 10, "now": now, "limit": 4 * 16, "inflight": "[]", "busy": "{}", "per_owner": 8}
    wanted = {name for name in params if f":{name}" in _query_text("due_webhooks")}
    params = {name: value for name, value in params.items() if name in wanted}
    spans, handed = [], 0
    for _ in range(args.looks):
        start = time.perf_counter()
        handed = len(rows(conn, "due_webhooks", **params))
        spans.append(time.perf_counter() - start)
    return {"webhooks": args.webhooks, "owners": args.owners, "look_ms": round(median(spans) * 1000, 3),
            "rows_per_look": handed, "params": sorted(params)}


def _query_text(name: str) -> str:
    from gpulayer.server.store.queries import QUERIES
    return QUERIES[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("launch").add_argument("--launches", type=int, default=40)
    checked = sub.add_parser("verify")
    checked.add_argument("--mib", type=int, default=1024)
    checked.add_argument("--rounds", type=int, default=3)
    sub.add_parser("relay-attack").add_argument("--seconds", type=float, default=15.0)
    hooks = sub.add_parser("due-webhooks")
    hooks.add_argument("--webhooks", type=int, default=1000)
    hooks.add_argument("--owners", type=int, default=1)
    hooks.add_argument("--looks", type=int, default=200)
    args = parser.parse_args()
    run = {"launch": launch, "verify": verify, "relay-attack": relay_attack, "due-webhooks": due_webhooks}[args.what]
    load = _load()
    with tempfile.TemporaryDirectory(prefix="bench-round4-") as tmp:
        os.chmod(tmp, 0o700)
        result = run(args, Path(tmp))
    import agent
    assert Path(agent.__file__).resolve().parents[1] == TREE, "gpulayer and agent from different trees"
    print(json.dumps({"what": args.what, "tree": str(TREE), "load_before": load, "load_after": _load()} | result))


if __name__ == "__main__":
    main()
