"""Job arrays and dependencies through the real CLI and the Python client, against a real control plane
process and a real worker process (`--parallel 2`), as a Slurm user would use them."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

import gpulayer as gl
from gpulayer.testing import CLI, clean_env, task_dirs, wait_for
from test_integration_cli import _job_id, _ok
from test_integration_waiting import _told

pytestmark = pytest.mark.timeout(300)


def _status(cluster, job_id) -> dict:
    return json.loads(_ok(cluster.cli("job", "status", str(job_id), "--json")).stdout)


def test_array_elements_see_their_index_and_fail_alone(cluster):
    script = 'echo "i=$GPULAYER_ARRAY_INDEX n=$GPULAYER_ARRAY_SIZE"; test "$GPULAYER_ARRAY_INDEX" -ne 7'
    result = cluster.cli("submit", "--array", "0-9%2", "--wait", "--", "sh", "-c", script)
    assert result.returncode == 1, result.stderr  # element 7 failed: the array failed, with its exit code
    job_id = _job_id(result)
    status = _status(cluster, job_id)
    assert status["state"] == "failed" and status["reason"] == "array_elements_failed"
    assert status["array"]["counts"] == {"succeeded": 9, "failed": 1}
    assert status["array"]["failed_indices"] == [7] and status["array"]["max_running"] == 2
    text = _ok(cluster.cli("job", "status", str(job_id))).stdout
    assert "array 0-9 %2: 10/10 done (9 succeeded, 1 failed)" in text and "failed indices: 7" in text
    assert _ok(cluster.cli("job", "logs", str(job_id), "--index", "3")).stdout.splitlines() == ["i=3 n=10"]
    every = _ok(cluster.cli("job", "logs", str(job_id))).stdout.splitlines()
    assert "[3] i=3 n=10" in every and len(every) == 10
    table = _ok(cluster.cli("job", "list", "--limit", "20")).stdout
    row = next(line for line in table.splitlines() if line.split() and line.split()[0] == str(job_id))
    assert "failed 10/10 done, 1 failed" in row
    assert re.search(r"\s(\d+-)?\d+:\d\d:\d\d\s+\d{4}-\d\d-\d\d ", row), row  # ELAPSED, then CREATED
    missing = cluster.cli("job", "logs", str(job_id), "--index", "10")
    assert missing.returncode != 0 and "no element 10" in missing.stderr and "Traceback" not in missing.stderr


def test_array_outputs_by_index(cluster):
    result = _ok(cluster.cli("submit", "--array", "1,5", "--output", "out/", "--wait", "--",
                             "sh", "-c", 'mkdir -p out && echo "$GPULAYER_ARRAY_INDEX" > out/i.txt'))
    dest = cluster.root / f"array-outputs-{_job_id(result)}"
    _ok(cluster.cli("job", "outputs", str(_job_id(result)), "--index", "5", "--dest", str(dest)))
    assert (dest / "out" / "i.txt").read_text() == "5\n"


def test_array_outputs_of_every_element_land_in_a_folder_per_index(cluster):
    # Three elements write the same path: each keeps its own file (issue 22 item 17)
    result = _ok(cluster.cli("submit", "--array", "0-2", "--output", "out/", "--", "sh", "-c",
                             'mkdir -p out && echo "element $GPULAYER_ARRAY_INDEX" > out/result.txt'))
    job_id = _job_id(result)
    assert cluster.wait_job(job_id, timeout=120)["state"] == "succeeded"
    dest = cluster.root / f"array-outputs-all-{job_id}"
    listed = _ok(cluster.cli("job", "outputs", str(job_id), "--dest", str(dest)))
    for index in range(3):
        assert (dest / str(index) / "out" / "result.txt").read_text() == f"element {index}\n"
    assert sorted(p.name for p in dest.iterdir()) == ["0", "1", "2"]
    assert "3 output files written" in listed.stderr, listed.stderr
    one = cluster.root / f"array-outputs-one-{job_id}"
    _ok(cluster.cli("job", "outputs", str(job_id), "--index", "1", "--dest", str(one)))
    assert (one / "out" / "result.txt").read_text() == "element 1\n"  # one element's: as they are


def test_ten_thousand_elements_one_request_capped_and_cancelled(cluster):
    result = _ok(cluster.cli("submit", "--array", "0-9999%2", "--name", "big-sweep", "--", "true"))
    job_id = _job_id(result)
    status = _status(cluster, job_id)
    assert status["array"]["size"] == 10_000 and len(status["tasks"]) <= 100
    wait_for(lambda: _status(cluster, job_id)["array"]["done"] >= 6, 120, "six elements to end")
    running = cluster.sql("SELECT count(*) FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running')",
                          (job_id,))[0][0]
    assert running <= 2
    row = next(line for line in _ok(cluster.cli("job", "list")).stdout.splitlines() if "big-sweep" in line)
    assert "/10000 done" in row
    assert "element 9999 cancelled" in _ok(cluster.cli("job", "cancel", str(job_id), "--index", "9999")).stdout
    again = cluster.cli("job", "cancel", str(job_id), "--index", "9999")
    assert again.returncode == 1 and "element 9999 has already ended" in again.stderr
    _ok(cluster.cli("job", "cancel", str(job_id)))
    wait_for(lambda: _status(cluster, job_id)["state"] == "cancelled", 30, "the array to be cancelled")
    left = cluster.sql("SELECT count(*) FROM tasks WHERE job_id = ? AND state IN ('queued', 'assigned')", (job_id,))
    assert left[0][0] == 0


def test_dependency_chain_waits_then_cascades(cluster):
    # The head fails once the test has looked at the waiting jobs: `go` appears in its working dir (what a
    # sandboxed task shares with the host).
    head = _job_id(_ok(cluster.cli("submit", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.1; done; exit 4")))
    second = _job_id(_ok(cluster.cli("submit", "--after", str(head), "--", "true")))
    third = _job_id(_ok(cluster.cli("submit", "--after", f"{second}:ok", "--", "true")))
    rescue = _job_id(_ok(cluster.cli("submit", "--after", f"{head}:notok", "--", "echo", "rescued")))
    status = _ok(cluster.cli("job", "status", str(second))).stdout
    assert "state=waiting" in status and f"waiting: for job {head} to succeed" in status
    assert _status(cluster, third)["waiting_reason"] == f"for job {second} to succeed"

    def let_the_head_go() -> bool:  # its running attempt's working dir, once there (a lost attempt is run again)
        for task in (t for t in cluster.job(head)["tasks"] if t["state"] == "running"):
            # on whichever worker runs it: another test of the shared cluster may have started a second one
            held = task_dirs(cluster.workers[task["worker_name"]].state_dir)  # in a sandbox made ahead or not
            for workdir in (path for path in held if path.name == f"{task['task_id']}-{task['attempt']}"):
                (workdir / "go").touch()
                return True
        return False
    wait_for(let_the_head_go, 30, "the head running", details=lambda: f"{cluster.job(head)}\n{cluster.logs()}")
    assert _ok(cluster.cli("job", "logs", str(rescue), "--follow")).stdout.splitlines() == ["rescued"]
    for job_id in (second, third):
        found = _status(cluster, job_id)
        assert (found["state"], found["reason"]) == ("cancelled", "dependency_failed")
    waited = cluster.cli("submit", "--after", str(head), "--wait", "--", "true")
    assert waited.returncode != 0 and _status(cluster, _job_id(waited))["reason"] == "dependency_failed"


def test_after_array_and_bad_dependencies(cluster):
    array = _job_id(_ok(cluster.cli("submit", "--array", "0-3", "--", "true")))
    after = _job_id(_ok(cluster.cli("submit", "--after-array", str(array), "--wait", "--", "echo", "after")))
    assert _status(cluster, array)["state"] == "succeeded" and _status(cluster, after)["state"] == "succeeded"
    plain = cluster.cli("submit", "--after-array", str(after), "--", "true")
    assert plain.returncode == 2 and f"job {after} is no array" in plain.stderr
    bad = cluster.cli("submit", "--after", "999999", "--", "true")
    assert bad.returncode != 0 and "no job 999999" in bad.stderr and "Traceback" not in bad.stderr
    usage = cluster.cli("submit", "--after", "12:sometimes", "--", "true")
    assert usage.returncode == 2 and "--after" in usage.stderr
    for digits in ("\u0663", "\u00b2"):  # an Arabic-Indic three, a superscript two: no job id
        usage = cluster.cli("submit", "--after", digits, "--", "true")
        assert usage.returncode == 2 and "--after" in usage.stderr and "Traceback" not in usage.stderr
        refused = cluster.request("POST", "/v1/jobs", json={"command": ["true"], "after": [digits]})
        assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("after[0]")
    bad_array = cluster.cli("submit", "--array", "9-1", "--", "true")
    assert bad_array.returncode != 0 and "array" in bad_array.stderr and "Traceback" not in bad_array.stderr


def test_python_client_arrays_and_after(cluster):
    with gl.connect(url=cluster.url, token=cluster.client_token) as client:
        array = client.submit(gl.job(["sh", "-c", "echo $GPULAYER_ARRAY_INDEX"], array=range(4), max_running=2))
        after = client.submit(gl.job(["echo", "done"], after=[array]))
        assert after.info()["state"] in ("waiting", "queued", "running", "succeeded")
        assert array.wait(timeout=120) == "succeeded" and after.wait(timeout=120) == "succeeded"
        assert [line["text"].strip() for line in array.logs(index=2) if line["stream"] == "stdout"] == ["2"]
        assert {line["index"] for line in array.logs()} == {0, 1, 2, 3}
        view = array.info()["array"]
        assert view.pop("started_at") <= array.info()["finished_at"]
        assert view == {"indices": "0-3", "size": 4, "max_running": 2, "counts": {"succeeded": 4}, "done": 4,
                        "failed_indices": [], "cancelled_indices": []}
        assert after.info()["after"][0]["job"] == array.id


def test_job_file_array_and_after_fields(cluster):
    job_file = cluster.root / "sweep.toml"
    job_file.write_text('command = ["python", "sweep.py"]\narray = "0-99%8"\nafter = [3, "4:any"]\n')
    spec = json.loads(_ok(cluster.cli("submit", "-f", str(job_file), "--dry-run")).stdout)
    assert (spec["array"], spec["after"]) == ("0-99%8", [3, "4:any"])
    spec = json.loads(_ok(cluster.cli("submit", "--array", "1,5", "--after", "7", "--after-array", "8",
                                      "--dry-run", "--", "true")).stdout)
    assert (spec["array"], spec["after"]) == ("1,5", ["7:ok", "8:ok"])


def test_a_running_array_says_why_its_other_elements_wait(cluster):
    # Each element takes every CPU of the biggest worker: one runs per worker, the others wait for capacity
    cpus = cluster.sql("SELECT max(cpus) FROM workers WHERE state = 'online'")[0][0]
    proc = subprocess.Popen([*CLI, "submit", "--array", "0-5", "--cpus", f"{cpus:g}", "--wait", "--", "sleep", "300"],
                            env=clean_env(**cluster.cli_env()), cwd=cluster.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = int(proc.stdout.readline())
    try:
        line = _told(proc, "waiting for capacity")
        assert "free at once" in line, line
        status = _status(cluster, job_id)
        assert status["state"] == "running" and status["waiting_reason"].startswith("waiting for capacity")
        status_out = _ok(cluster.cli("job", "status", str(job_id))).stdout
        assert "\nwaiting for capacity: " in status_out and "waiting: waiting" not in status_out
    finally:
        _ok(cluster.cli("job", "cancel", str(job_id)))
        proc.communicate(timeout=60)
    assert proc.returncode == 1


def test_status_of_a_cancelled_array_names_indices_as_ranges(cluster):
    script = 'test "$GPULAYER_ARRAY_INDEX" -ge 2 && sleep 300; exit 3'  # elements 0 and 1 fail, 2 runs on
    job_id = _job_id(_ok(cluster.cli("submit", "--array", "0-1199%1", "--", "sh", "-c", script)))
    wait_for(lambda: _status(cluster, job_id)["array"]["counts"].get("running"), 60, "element 2 to run")
    _ok(cluster.cli("job", "cancel", str(job_id)))
    wait_for(lambda: _status(cluster, job_id)["array"]["counts"] == {"failed": 2, "cancelled": 1198}, 60,
             "every element to end")
    text = _ok(cluster.cli("job", "status", str(job_id))).stdout
    assert "array 0-1199 %1: 1200/1200 done (2 failed, 1198 cancelled)" in text
    assert f"failed indices: 0-1  (their logs: gpulayer job logs {job_id} --index N)" in text
    assert "cancelled indices: 2-999 ...\n" in text  # the first 1,000 that did not succeed, by index
