"""Declared outputs are regular files only: a FIFO, a socket or a link is skipped with a log line, never opened
in a way that blocks the worker's slot (real control plane and worker processes for the end-to-end cases)."""
from __future__ import annotations

import os
import socket
import time

import pytest

from agent.artifacts.beneath import Beneath
from agent.artifacts.outputs import NotRegularFile, collect_outputs, upload_outputs
from gpulayer.testing import ControlPlaneProcess, wait_for

pytestmark = pytest.mark.timeout(90)


def test_only_regular_files_are_collected_and_the_rest_is_reported(tmp_path):
    (tmp_path / "ok.txt").write_text("fine")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "ok.txt")
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "inner.txt").write_text("also fine")
    os.mkfifo(folder / "inner-fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock"))
        files, problems = collect_outputs(tmp_path, ["ok.txt", "fifo", "link", "dir"])
    assert sorted(files) == ["dir/inner.txt", "ok.txt"]
    assert len(problems) == 4 and all("not a regular file: skipped" in p for p in problems), problems
    assert any("'fifo'" in p and "FIFO" in p for p in problems)


def test_a_file_swapped_for_a_fifo_after_collecting_is_skipped_without_blocking(tmp_path):
    (tmp_path / "out").write_text("x")
    files, _ = collect_outputs(tmp_path, ["out"])
    (tmp_path / "out").unlink()
    os.mkfifo(tmp_path / "out")
    notes = []
    started = time.monotonic()
    recorded = upload_outputs(tmp_path, files, lambda key, digest, path: True, notes.append)
    assert recorded == {} and time.monotonic() - started < 5
    assert notes and "not a regular file" in notes[0]
    with pytest.raises(NotRegularFile), Beneath.at(tmp_path) as root:
        root.open_regular("out")


@pytest.fixture
def plane(tmp_path):
    with ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3) as p:
        yield p


def test_a_fifo_declared_as_an_output_does_not_hold_the_workers_slot(plane):
    worker = plane.start_worker("w", parallel=1)
    fifo_job = plane.submit({"command": ["mkfifo", "result"], "outputs": ["result"]})
    done = plane.wait_job(fifo_job, timeout=20)
    assert done["state"] == "succeeded", (done, plane.logs())
    logs = "\n".join(line["text"] for line in plane.get_json(f"/v1/jobs/{fifo_job}/logs")["lines"])
    assert "output 'result' is a FIFO, not a regular file: skipped" in logs, logs

    after = plane.submit({"command": ["sh", "-c", "echo hi > out"], "outputs": ["out"]})
    assert plane.wait_job(after, timeout=20)["state"] == "succeeded"
    assert worker.stop(timeout=15) == 0, worker.log()
