"""The replica's lease changes one writer at a time (replication/lease.py, swap_lease): racing claimers, on real files."""
from __future__ import annotations

import random
import threading
import time

import pytest

from gpulayer.server.replication import lease as writer_lease
from gpulayer.server.replication.lease import LeaseLost, read_lease, swap_lease


def test_a_renewal_that_read_the_lease_before_a_take_over_loses_and_leaves_it_alone(tmp_path, monkeypatch):
    holder = swap_lease(tmp_path, "old", tmp_path / "old", 1.0, expect=None)
    real_read = writer_lease.read_lease
    taken = {}

    def read_then_taken(directory):
        lease = real_read(directory)   # the holder has read its own lease: now the restore takes it
        if not taken:
            taken["gen"] = 0
            taken["gen"] = swap_lease(directory, "new", tmp_path / "new", 2.0, expect=None)
        return lease
    monkeypatch.setattr(writer_lease, "read_lease", read_then_taken)
    with pytest.raises(LeaseLost):
        swap_lease(tmp_path, "old", tmp_path / "old", 3.0, expect=holder)
    monkeypatch.setattr(writer_lease, "read_lease", real_read)
    lease = read_lease(tmp_path)
    assert lease["writer"] == "new" and lease["generation"] == taken["gen"] > holder


def test_two_claimers_racing_for_one_generation(tmp_path, monkeypatch):
    """A holder renewing and a restore taking over at the same instant, many times, with random delays
    between each one's read, claim and write: the restore ends up holding the lease, and the holder's
    next renewal always finds out (never two writers that both keep renewing)."""
    real_write = writer_lease.write_lease

    def slow_write(*args, **kwargs):
        time.sleep(random.uniform(0, 0.003))
        real_write(*args, **kwargs)
    monkeypatch.setattr(writer_lease, "write_lease", slow_write)
    for round_ in range(40):
        directory = tmp_path / str(round_)
        directory.mkdir()
        held = swap_lease(directory, "old", tmp_path / "old", 1.0, expect=None)
        start = threading.Barrier(2)
        result: dict = {}

        threads = [threading.Thread(target=_renew, args=(directory, held, start, result, tmp_path)),
                   threading.Thread(target=_take_over, args=(directory, start, result, tmp_path))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert result.get("new") is not None, "the take-over never got the lease"
        lease = read_lease(directory)
        assert lease["writer"] == "new" and lease["generation"] == result["new"]
        last_old = result["old"] if result["old"] is not None else held
        with pytest.raises(LeaseLost):   # the old holder's next renewal stops it
            swap_lease(directory, "old", tmp_path / "old", 3.0, expect=last_old)
        assert read_lease(directory)["writer"] == "new"
        assert swap_lease(directory, "new", tmp_path / "new", 3.0, expect=result["new"]) > result["new"]
    assert len(list(tmp_path.glob(f"0/{writer_lease.CLAIM_PREFIX}*"))) <= writer_lease.CLAIMS_KEPT + 1


def _renew(directory, held, start, result, root):
    start.wait()
    try:
        result["old"] = swap_lease(directory, "old", root / "old", 2.0, expect=held)
    except LeaseLost:
        result["old"] = None


def _take_over(directory, start, result, root):
    start.wait()
    for _ in range(20):
        try:
            result["new"] = swap_lease(directory, "new", root / "new", 2.0, expect=None)
            return
        except LeaseLost:
            time.sleep(0.001)


def test_a_failed_write_gives_its_generation_back(tmp_path, monkeypatch):
    held = swap_lease(tmp_path, "old", tmp_path, 1.0, expect=None)

    def eio(*args, **kwargs):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(writer_lease, "write_lease", eio)
    with pytest.raises(OSError):
        swap_lease(tmp_path, "old", tmp_path, 2.0, expect=held)
    monkeypatch.undo()
    assert swap_lease(tmp_path, "old", tmp_path, 3.0, expect=held) == held + 1  # a blip does not fence


def test_old_claims_are_removed(tmp_path):
    gen = swap_lease(tmp_path, "w", tmp_path, 1.0, expect=None)
    for _ in range(30):
        gen = swap_lease(tmp_path, "w", tmp_path, 1.0, expect=gen)
    claims = sorted(int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob(f"{writer_lease.CLAIM_PREFIX}*"))
    assert claims[-1] == gen and len(claims) <= writer_lease.CLAIMS_KEPT + 1
