"""The CLI against a real control plane process and a real worker process (plain HTTP, 127.0.0.1)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpulayer.testing import wait_for

pytestmark = pytest.mark.timeout(300)


def _ok(result, code=0):
    assert result.returncode == code, f"exit {result.returncode}\nstdout:{result.stdout}\nstderr:{result.stderr}"
    return result


def _job_id(result) -> int:
    return int(result.stdout.splitlines()[0])


def test_submit_wait_echo_hello(cluster):
    result = _ok(cluster.cli("submit", "--wait", "--", "echo", "hello"))
    job_id = _job_id(result)
    logs = _ok(cluster.cli("job", "logs", str(job_id)))
    assert "hello" in logs.stdout.splitlines()


def test_submit_wait_exits_with_the_jobs_code(cluster):
    result = cluster.cli("submit", "--wait", "--", "sh", "-c", "echo oops >&2; exit 3")
    assert result.returncode == 3, result.stderr
    status = json.loads(_ok(cluster.cli("job", "status", result.stdout.split()[0], "--json")).stdout)
    assert status["state"] == "failed" and status["exit_code"] == 3


def test_submit_follow_streams_stdout_and_stderr(cluster):
    result = _ok(cluster.cli("submit", "--follow", "--", "sh", "-c", "echo out; echo err >&2"))
    lines = result.stdout.splitlines()
    assert lines[0].isdigit() and "out" in lines[1:]
    assert "err" in result.stderr.splitlines()


def test_submit_json_status_and_list(cluster):
    result = _ok(cluster.cli("submit", "--json", "--name", "listed", "--env", "A=1", "--", "true"))
    job = json.loads(result.stdout.splitlines()[0])
    assert job["name"] == "listed" and job["spec"]["env"] == {"A": "1"}
    wait_for(lambda: json.loads(cluster.cli("job", "status", str(job["id"]), "--json").stdout)["state"]
             == "succeeded", 60, "the job to succeed")
    listed = json.loads(_ok(cluster.cli("job", "list", "--json", "--limit", "50")).stdout)
    assert job["id"] in [j["id"] for j in listed]
    listed = json.loads(_ok(cluster.cli("job", "list", "--json", "--state", "succeeded")).stdout)
    assert all(j["state"] == "succeeded" for j in listed)
    status = _ok(cluster.cli("job", "status", str(job["id"]))).stdout
    assert "state=succeeded" in status and "worker=" in status and "endpoint=" in status
    table = _ok(cluster.cli("job", "list")).stdout
    assert table.startswith("ID") and "listed" in table


def test_cancel_a_running_job(cluster):
    job_id = _job_id(_ok(cluster.cli("submit", "--", "sleep", "120")))
    wait_for(lambda: json.loads(cluster.cli("job", "status", str(job_id), "--json").stdout)["state"]
             == "running", 60, "the job to run")
    _ok(cluster.cli("job", "cancel", str(job_id)))
    wait_for(lambda: json.loads(cluster.cli("job", "status", str(job_id), "--json").stdout)["state"]
             == "cancelled", 30, "the job to be cancelled")
    events = json.loads(_ok(cluster.cli("job", "events", str(job_id), "--json")).stdout)
    assert events and all("kind" in e for e in events)


def test_inputs_and_outputs_round_trip(cluster):
    data = cluster.root / "data"
    data.mkdir(exist_ok=True)
    (data / "in.bin").write_bytes(os.urandom(100_000))
    result = _ok(cluster.cli("submit", "--wait", "--input", "data/in.bin", "--output", "out/", "--",
                             "sh", "-c", "mkdir -p out && cp data/in.bin out/copy.bin"))
    dest = cluster.root / "downloaded"
    listed = _ok(cluster.cli("job", "outputs", str(_job_id(result)), "--dest", str(dest))).stdout
    assert (dest / "out" / "copy.bin").read_bytes() == (data / "in.bin").read_bytes()
    assert listed.split() == [str(dest / "out" / "copy.bin")]


def test_new_output_content_comes_back(cluster):
    result = _ok(cluster.cli("submit", "--wait", "--output", "out/", "--",
                             "sh", "-c", "mkdir -p out && echo note > out/note.txt"))
    dest = cluster.root / "downloaded-new"
    _ok(cluster.cli("job", "outputs", str(_job_id(result)), "--dest", str(dest)))
    assert (dest / "out" / "note.txt").read_text() == "note\n"


def test_source_sends_what_git_does_not_ignore(cluster):
    """Tracked and untracked files go; what .gitignore names stays home (issue 36 item 21)."""
    repo = cluster.root / "repo"
    repo.mkdir()
    (repo / "tracked.txt").write_text("t")
    (repo / ".gitignore").write_text("*.ckpt\n")
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "tracked.txt", ".gitignore"], check=True)
    (repo / "untracked.txt").write_text("u")
    (repo / "big.ckpt").write_text("ignored")
    result = _ok(cluster.cli("submit", "--follow", "--source", str(repo), "--", "ls"))
    listed = result.stdout.splitlines()
    assert "tracked.txt" in listed and "untracked.txt" in listed and "big.ckpt" not in listed, listed


def test_worker_list(cluster):
    workers = json.loads(_ok(cluster.cli("worker", "list", "--json")).stdout)
    assert any(w["name"] == "w1" and w["state"] == "online" for w in workers)
    assert "w1" in _ok(cluster.cli("worker", "list")).stdout


def test_server_refusals_are_one_line_with_the_code(cluster):
    result = cluster.cli("job", "status", "999999")
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and "not_found" in result.stderr
    assert "Traceback" not in result.stderr
    result = cluster.cli("job", "list", GPULAYER_TOKEN="glc_wrong")
    assert result.returncode == 1 and "unauthorized" in result.stderr


def test_timeout_ends_the_job(cluster):
    result = cluster.cli("submit", "--wait", "--timeout", "1", "--", "sleep", "30")
    assert result.returncode != 0
    status = json.loads(cluster.cli("job", "status", result.stdout.split()[0], "--json").stdout)
    assert status["state"] == "failed"


def test_tokens_create_list_revoke(cluster):
    minted = json.loads(_ok(cluster.cli("token", "create", "--name", "gpu-dev", "--label", "pool=a100",
                                        "--expires", "1d", "--json")).stdout)
    assert minted["token"].startswith("glj_") and minted["labels"] == {"pool": "a100"}
    plain = _ok(cluster.cli("token", "create", "--name", "plain"))
    assert plain.stdout.strip().startswith("glj_") and len(plain.stdout.splitlines()) == 1
    listed = _ok(cluster.cli("token", "list", "--json")).stdout
    assert minted["jti"] in listed and minted["token"] not in listed
    _ok(cluster.cli("token", "revoke", minted["jti"]))
    assert cluster.cli("token", "revoke", "no-such-jti").returncode == 1


def test_secrets_set_list_delete(cluster):
    _ok(cluster.cli("secret", "set", "API_KEY", "--label", "pool=a100", input="s3cr3t-value\n"))
    listed = _ok(cluster.cli("secret", "list", "--json")).stdout
    assert "API_KEY" in listed and "s3cr3t-value" not in listed
    assert "API_KEY" in _ok(cluster.cli("secret", "list")).stdout
    _ok(cluster.cli("secret", "delete", "API_KEY"))
    again = cluster.cli("secret", "delete", "API_KEY")
    assert again.returncode == 1 and again.stderr.startswith("Error: ")


def test_secret_reaches_the_job(cluster):
    _ok(cluster.cli("secret", "set", "MY_SECRET", input="hunter2"))
    result = _ok(cluster.cli("submit", "--follow", "--secret", "MY_SECRET", "--",
                             "sh", "-c", 'test "$MY_SECRET" = hunter2 && echo matched'))
    assert "matched" in result.stdout.splitlines()


def test_service_prints_its_endpoint_and_cancel_stops_it(cluster):
    import requests
    result = _ok(cluster.cli("submit", "--service", "--", "sh", "-c",
                             'exec python3 -m http.server "$PORT" --bind 127.0.0.1'))
    job_id, endpoint = result.stdout.split()
    assert endpoint.startswith("127.0.0.1:")
    assert requests.get(f"http://{endpoint}/", timeout=5).ok
    assert f"endpoint={endpoint}" in _ok(cluster.cli("job", "status", job_id)).stdout
    _ok(cluster.cli("job", "cancel", job_id))
    wait_for(lambda: json.loads(cluster.cli("job", "status", job_id, "--json").stdout)["state"]
             == "cancelled", 30, "the service to stop")


def test_multi_node_job_status_shows_each_ranks_worker(cluster):
    if "w2" not in cluster.workers:
        cluster.start_worker("w2", parallel=1)
    result = _ok(cluster.cli("submit", "--nodes", "2", "--follow", "--", "sh", "-c", 'echo "rank=$RANK of $WORLD_SIZE"'))
    assert {"rank=0 of 2", "rank=1 of 2"} <= {line.split("] ")[-1] for line in result.stdout.splitlines()}
    status = _ok(cluster.cli("job", "status", result.stdout.split()[0])).stdout
    task_lines = [line for line in status.splitlines() if line.strip().startswith("task ")]
    assert len(task_lines) == 2 and all("address=127.0.0.1" in line for line in task_lines)
    assert {"index=0", "index=1"} <= set(" ".join(task_lines).split())


def test_input_folder_is_uploaded_file_by_file(cluster):
    folder = cluster.root / "inputs" / "set"
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("A")
    (folder / "sub" / "b.txt").write_text("B")
    result = _ok(cluster.cli("submit", "--follow", "--input", "inputs/set", "--",
                             "sh", "-c", "cat inputs/set/a.txt inputs/set/sub/b.txt; echo"))
    assert "AB" in result.stdout.splitlines()
