"""GPU samples on the server (runtime/gpu_samples.py, scheduler/gpu_samples.py): buffered off the write path, written in upkeep's
one transaction per tick, kept through a failed flush, bounded, and pruned by retention."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.server.runtime.gpu_samples import Buffer
from gpulayer.server.scheduler import gpu_samples, retention

from helpers import add_worker

DAY = 86400.0


def sample(index: int, at: float, util: float | None = 50.0) -> dict:
    return {"index": index, "at": at, "utilization_pct": util, "memory_used_mb": 100, "memory_total_mb": 1000}


def count(store, where: str = "1") -> int:
    return store.read(lambda c: c.execute(f"SELECT count(*) AS n FROM gpu_samples WHERE {where}").fetchall())[0]["n"]


def test_heartbeats_with_samples_write_nothing_and_one_tick_writes_them_all(sched, clock, monkeypatch):
    workers = [add_worker(sched, f"w{i}", gpus=8) for i in range(3)]
    sched.expire()
    writes: list[str] = []  # the writer transactions asked for, by function name
    real = sched.store.write
    monkeypatch.setattr(sched.store, "write", lambda fn, *a, **k: writes.append(fn.__name__) or real(fn, *a, **k))
    for _ in range(4):
        clock.advance(0.5)
        for w in workers:
            sched.heartbeat(w, [], samples=[sample(g, clock.now) for g in range(8)])
    assert writes == [] and count(sched.store) == 0 and len(sched.gpu_samples) == 4 * 3 * 8
    sched.expire()
    assert writes == ["_expire"]  # the renewals' transaction, one statement more
    assert count(sched.store) == 96 and len(sched.gpu_samples) == 0
    sched.expire()
    assert count(sched.store) == 96  # nothing written twice


def test_a_gone_workers_samples_are_dropped(sched, clock):
    w = add_worker(sched, "w", gpus=1)
    sched.deregister(w)
    answer = sched.heartbeat(w, [], samples=[sample(0, clock.now)])
    assert answer["lease_expires_at"] is None and len(sched.gpu_samples) == 0


def test_a_failed_flush_keeps_the_samples_for_the_next(sched, clock, monkeypatch):
    w = add_worker(sched, "w", gpus=1)
    sched.heartbeat(w, [], samples=[sample(0, clock.now)])

    def broken(conn, taken):
        raise RuntimeError("disk trouble")

    monkeypatch.setattr(gpu_samples, "flush", broken)
    with pytest.raises(RuntimeError):
        sched.expire()
    monkeypatch.undo()
    clock.advance(1)
    sched.heartbeat(w, [], samples=[sample(0, clock.now)])
    assert len(sched.gpu_samples) == 2
    sched.expire()
    assert [r["at"] for r in sched.store.read(lambda c: c.execute("SELECT at FROM gpu_samples ORDER BY rowid").fetchall())] == [
        clock.now - 1,
        clock.now,
    ]


def test_samples_sql_refuses_are_dropped_and_upkeep_goes_on(sched, clock):
    w = add_worker(sched, "w", gpus=1)
    sched.expire()
    sched.gpu_samples.add(w, [{**sample(0, clock.now), "index": "zero"}], clock.now)  # past the wire's checks
    clock.advance(10)  # past the worker's lease: upkeep must still judge it
    assert sched.expire()["workers_offline"] == 1
    assert count(sched.store) == 0 and len(sched.gpu_samples) == 0


def test_the_buffer_keeps_the_newest_past_its_limit():
    buffer = Buffer(limit=5)
    buffer.add(1, [sample(0, float(t)) for t in range(4)], now=100.0)
    buffer.add(2, [sample(0, float(t)) for t in range(4, 8)], now=100.0)
    taken = buffer.take()
    assert [s[2] for s in taken] == [3.0, 4.0, 5.0, 6.0, 7.0] and buffer.dropped == 3
    buffer.add(1, [sample(0, 8.0)], now=100.0)
    buffer.put_back(taken)
    assert [s[2] for s in buffer.take()] == [4.0, 5.0, 6.0, 7.0, 8.0]


def test_retention_prunes_old_samples_and_dry_run_counts_them(sched, store, clock, monkeypatch):
    w = add_worker(sched, "w", gpus=2)
    old = [sample(g, clock.now - 8 * DAY + i) for i in range(30) for g in range(2)]
    sched.heartbeat(w, [], samples=old + [sample(0, clock.now - DAY), sample(1, clock.now)])
    sched.expire()
    keep = {"log_retention_s": 14 * DAY, "job_retention_s": 30 * DAY}
    dry = retention.prune(store, now=clock.now, dry_run=True, **keep)
    assert dry["gpu_samples"] == 60 and count(store) == 62
    monkeypatch.setattr(retention, "PRUNE_SAMPLES", 25)  # three writes: 25, 25, 10
    done = retention.prune(store, now=clock.now, **keep)
    assert done["gpu_samples"] == 60 and done["done"] and count(store) == 2
    shorter = retention.prune(store, now=clock.now, gpu_sample_retention_s=0.5 * DAY, **keep)
    assert shorter["gpu_samples"] == 1 and count(store, f"at = {clock.now}") == 1


def test_server_prune_counts_gpu_samples(home, sched, clock):
    w = add_worker(sched, "w", gpus=1)
    sched.heartbeat(w, [], samples=[sample(0, clock.now)])  # the pinned clock: long before the real now
    sched.expire()
    runner = CliRunner()
    dry = runner.invoke(app, ["server", "prune", "--home", str(home), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["gpu_samples"] == 1 and count(sched.store) == 1
    kept = runner.invoke(app, ["server", "prune", "--home", str(home), "--gpu-sample-retention", "100000d"])
    assert kept.exit_code == 0 and kept.output.rstrip().endswith(", 0 GPU samples"), kept.output
    done = runner.invoke(app, ["server", "prune", "--home", str(home)])
    assert done.exit_code == 0 and done.output.rstrip().endswith(", 1 GPU sample"), done.output
    assert count(sched.store) == 0
    bad = runner.invoke(app, ["server", "prune", "--home", str(home), "--gpu-sample-retention", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output
