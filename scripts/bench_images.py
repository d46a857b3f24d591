"""What an OCI image costs a job (issue 24 part 2): the first and the second start of an image job, against a
plain sandboxed `true`. One sitting; the image is a static busybox built with umoci (tests/ociimages.py).

1. On the agent alone: preparing the image the first time (the blobs through the artifact cache, every layer
   checked, `umoci unpack --rootless`) and the second (found in the cache); then the launch of `true` in the
   image against `true` in the plain sandbox (`Sandbox.wrap`), N times each, interleaved; medians.
2. Through a real server and a real worker of this tree (`--sandbox bwrap`): submit-to-succeeded of a `true`
   job from an image the control plane and the worker have never seen (upload, fetch, unpack: the first
   start), of the same image again (nothing uploaded, nothing unpacked: the second), and of a plain `true`.

    python scripts/bench_images.py [--rounds 10] [--launches 100] [--jobs 20] [--json]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Server, emit, machine, machine_line, median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import gpulayer as gl  # noqa: E402
from agent.artifacts.cache import ArtifactCache  # noqa: E402
from agent.sandbox.imagerun import TASK_DIR, image_environment, wrap_image  # noqa: E402
from agent.sandbox.images import ImageCache  # noqa: E402
from agent.sandbox.bwrap import resolve  # noqa: E402
from gpulayer.protocol.jobspec import ImageSpec  # noqa: E402
from ociimages import archive, build_layout, manifest_of  # noqa: E402


def _spec(layout: Path) -> ImageSpec:
    digest, manifest = manifest_of(layout)
    return ImageSpec(manifest=digest, ref="bench",
                     blobs=[manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])])


def agent_side(rounds: int, count: int, tmp: Path) -> dict:
    """Median ms of the first and second prepare, and of `true` launched in the image and in the plain sandbox."""
    layout = build_layout(tmp / "agent-image")

    def fetch(digest, out):
        out.write((layout / "blobs" / "sha256" / digest[7:]).read_bytes())
    first, second = [], []
    for index in range(rounds):
        images = ImageCache(ArtifactCache(tmp / f"cache-{index}", 1 << 30, fetch))
        for into in (first, second):
            start = time.perf_counter()
            prepared = images.prepare(_spec(layout), lambda _: None)
            into.append(time.perf_counter() - start)
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    workdir = tmp / "task"
    workdir.mkdir()
    sandbox.give(workdir)
    in_image, env = wrap_image(sandbox, prepared, ["true"], image_environment(prepared.config), str(workdir),
                               TASK_DIR, gpu_nodes=[], driver=[])
    plain = sandbox.wrap(["true"], str(workdir), gpu_nodes=[])
    boxed_s, image_s = [], []
    for _ in range(count):
        for argv, argv_env, into in ((plain, None, boxed_s), (in_image, env, image_s)):
            start = time.perf_counter()
            subprocess.run(argv, env=argv_env, check=True, start_new_session=True)
            into.append(time.perf_counter() - start)
    return {"first_prepare_ms": median(first) * 1000, "second_prepare_ms": median(second) * 1000,
            "launch_sandboxed_ms": median(boxed_s) * 1000, "launch_in_image_ms": median(image_s) * 1000}


def jobs(count: int, tmp: Path) -> dict:
    """Median submit-to-succeeded (ms): a never-seen image, the same image again, a plain `true`."""
    spans: dict[str, list[float]] = {"first": [], "second": [], "plain": []}
    with Server() as server:
        server.start_worker("bench", labels={"pool": "img"}, args=["--sandbox", "bwrap"])
        with server.client() as client:
            for index in range(count):
                image = archive(build_layout(tmp / f"job-{index}", marker=f"image {index}"), tmp / f"job-{index}.tar")
                for kind, spec in (("first", gl.job(["true"], image=str(image), labels={"pool": "img"})),
                                   ("second", gl.job(["true"], image=str(image), labels={"pool": "img"})),
                                   ("plain", gl.job(["true"], labels={"pool": "img"}))):
                    start = time.perf_counter()
                    job = client.submit(spec)
                    state = job.wait(timeout=120)
                    assert state == "succeeded", (kind, state, job.info())
                    spans[kind].append(time.perf_counter() - start)
    return {kind: median(values) * 1000 for kind, values in spans.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--launches", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        agent = agent_side(args.rounds, args.launches, Path(tmp))
        through = jobs(args.jobs, Path(tmp))
    result = {"machine": machine(), "agent": agent, "jobs": through}
    lines = [machine_line(result["machine"]),
             f"prepare the image (median of {args.rounds}): first {agent['first_prepare_ms']:.1f} ms "
             f"(fetch, check, umoci unpack), second {agent['second_prepare_ms']:.2f} ms (cached)",
             f"launch of `true` (median of {args.launches}): plain sandbox {agent['launch_sandboxed_ms']:.2f} ms, "
             f"in the image {agent['launch_in_image_ms']:.2f} ms",
             f"`true` job, submit to succeeded (median of {args.jobs}): first start of an image "
             f"{through['first']:.1f} ms, second {through['second']:.1f} ms, plain sandboxed {through['plain']:.1f} ms"]
    emit(result, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
