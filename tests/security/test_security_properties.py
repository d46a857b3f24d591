"""Property tests (hypothesis): the job spec validator and the agent's bundle unpacker.

- gpulayer.server.scheduler.spec.validate_job raises nothing but InvalidRequest, whatever JSON
  it is given; what it accepts is JSON-serialisable and a fixed point
  (validating the normalised spec again gives the same spec).
- agent.artifacts.bundle.unpack_bundle, for arbitrary tar members (names with `..`,
  absolute paths, backslashes, NULs; symlinks and hard links anywhere; devices
  and fifos), either refuses the bundle having written nothing, or writes only
  inside the target directory; nothing outside it ever changes.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.artifacts.bundle import unpack_bundle
from agent.errors import TaskSetupError
from gpulayer.server.errors import InvalidRequest
from gpulayer.protocol.fields import to_wire
from gpulayer.server.scheduler.spec import JOB_FIELDS, validate_job

# -- validate_job ----------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | \
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
names = st.sampled_from(sorted(JOB_FIELDS) + ["replicas", "bogus", ""])
plausible = st.fixed_dictionaries(
    {"command": st.lists(st.text(min_size=0, max_size=8), min_size=0, max_size=3) | json_values},
    optional={
        "name": st.none() | st.text(max_size=10) | json_values,
        "env": st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True) | st.text(max_size=4),
                               st.text(max_size=6) | json_values, max_size=3),
        "gpus": st.integers(-2, 2000) | json_values, "cpus": st.floats() | st.integers(-1, 10) | json_values,
        "memory_mb": st.integers(-1, 1 << 50) | json_values,
        "accelerator": st.sampled_from(["cuda", None, "rocm"]) | json_values,
        "labels": st.dictionaries(st.text(max_size=8), st.text(max_size=8) | json_values, max_size=3),
        "retry": st.fixed_dictionaries({}, optional={
            "max_attempts": st.integers(-1, 200) | json_values,
            "retry_on": st.lists(st.sampled_from(["worker_lost", "failed", "timed_out", "nope"]), max_size=3)
            | json_values}) | json_values,
        "timeout_seconds": st.none() | st.floats() | st.integers(-5, 10**9) | json_values,
        "source": st.none() | st.just("sha256:" + "a" * 64) | st.text(max_size=70),
        "inputs": st.dictionaries(st.text(max_size=8), st.just("sha256:" + "b" * 64) | st.text(max_size=5), max_size=3),
        "outputs": st.lists(st.text(max_size=8), max_size=3) | json_values,
        "nodes": st.integers(-1, 2000) | json_values,
        "service": st.none() | st.fixed_dictionaries({}, optional={
            "replicas": st.integers(-1, 3000) | json_values, "port": json_values,
            "restart": st.sampled_from(["always", "on_failure", "never"]),
            "health": st.none() | st.fixed_dictionaries({"http_path": st.text(max_size=6)}) | json_values,
            "max_restarts": json_values, "weights": json_values}) | json_values,
        "priority": st.integers(-(1 << 64), 1 << 64) | json_values,
        "secrets": st.lists(st.text(max_size=6), max_size=3) | json_values,
    })


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=plausible | json_values | st.dictionaries(names, json_values, max_size=6))
def test_validate_job_raises_only_invalid_request_and_accepted_specs_round_trip(spec):
    try:
        normalised = validate_job(spec)
    except InvalidRequest as exc:
        assert exc.status == 400 and str(exc)
        return
    again = validate_job(json.loads(json.dumps(to_wire(normalised), allow_nan=False)))
    assert again == normalised


# -- the bundle unpacker ---------------------------------------------------------

segment = st.sampled_from(["a", "b", "..", ".", "", "c.txt", "/", "\\", "..\\..", "x\x00y", "~", "/etc"])
member_names = st.lists(segment, min_size=1, max_size=5).map("/".join) | st.text(max_size=12)
link_targets = member_names | st.sampled_from(["/etc/passwd", "../outside", "../../outside", "a/../../outside",
                                               "/tmp", "a", "a/b", "."])
kinds = st.sampled_from(["file", "dir", "symlink", "hardlink", "chr", "blk", "fifo"])
members = st.lists(st.tuples(member_names, kinds, link_targets), min_size=1, max_size=8)


def _bundle(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, target in entries:
            info = tarfile.TarInfo(name or "x")
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            data = b"payload" if kind == "file" else b""
            info.size = len(data)
            if kind in ("symlink", "hardlink"):
                info.linkname = target
            try:
                tar.addfile(info, io.BytesIO(data) if data else None)
            except (ValueError, UnicodeError):
                continue
    return buf.getvalue()


def _snapshot(root: Path) -> dict:
    """Every path under root (links not followed) with what it is."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = os.readlink(p) if p.is_symlink() else \
                "dir" if p.is_dir() else p.read_bytes()
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=members)
def test_unpacker_never_writes_outside_the_target(tmp_path_factory, entries):
    base = tmp_path_factory.mktemp("unpack")
    outside = base / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("untouched")
    target = base / "sandbox" / "task"
    target.mkdir(parents=True)
    bundle = base / "bundle.tar.gz"
    bundle.write_bytes(_bundle(entries))
    before_outside = _snapshot(base / "outside")
    try:
        unpack_bundle(bundle, target)
        refused = False
    except TaskSetupError:       # UnsafeBundle is a TaskSetupError
        refused = True
    assert _snapshot(base / "outside") == before_outside
    assert sorted(p.name for p in base.iterdir()) == ["bundle.tar.gz", "outside", "sandbox"]
    assert [p.name for p in (base / "sandbox").iterdir()] == ["task"]
    if refused:
        assert _snapshot(target) == {}, "a refused bundle must leave nothing behind"
    real_target = target.resolve()
    for dirpath, dirnames, filenames in os.walk(target, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            assert not (p.is_char_device() or p.is_block_device() or p.is_fifo()), p
            if p.is_symlink():
                resolved = p.resolve()
                assert resolved == real_target or real_target in resolved.parents, (p, os.readlink(p))
            elif p.is_file():  # a hard link never reaches a file outside
                assert p.stat().st_ino != (outside / "keep.txt").stat().st_ino, p


def test_found_by_the_property_a_symlink_in_an_unlisted_folder_unpacks(tmp_path):
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(_bundle([("src/main.py", "file", ""), ("bin/run", "symlink", "../src/main.py")]))
    (tmp_path / "t").mkdir()
    assert unpack_bundle(bundle, tmp_path / "t") == 2
    assert (tmp_path / "t" / "bin" / "run").read_bytes() == b"payload"


def test_found_by_the_property_a_failed_unpacking_leaves_nothing(tmp_path):
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(_bundle([("a", "symlink", ""), ("x", "file", "")]))
    (tmp_path / "t").mkdir()
    try:
        unpack_bundle(bundle, tmp_path / "t")
    except TaskSetupError:
        pass
    assert list((tmp_path / "t").iterdir()) == []
