"""Array elements of one job share one sandbox on a worker (issue 25, item 3; agent/sandbox/shared.py): a real server, real
worker processes, real bwrap and nsenter. The isolation tests of test_sandbox.py, run as array elements: the attack
reads nothing; another job's elements are not seen; exit codes, a cancel's grace and a timeout read as a task's.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from integration_cluster import Cluster
from test_sandbox import ATTACK, SECRET, module_cluster, processes_running

from gpulayer.testing import wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None or not sys.platform.startswith("linux")
    or os.geteuid() != 0, reason="a shared sandbox needs bwrap and nsenter on Linux, and a root agent")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "shared")


def start(cluster: Cluster, name: str, *args: str, env: dict | None = None, **options):
    return cluster.start_worker(name, labels={"pool": name}, args=list(args), env=env or {}, **options)


def element_log(cluster: Cluster, job_id: int, index: int) -> str:
    return "\n".join(line["text"] for line in cluster.api(f"/jobs/{job_id}/logs?index={index}&limit=1000")["lines"])


def run_array(cluster: Cluster, pool: str, command: list[str], array: str = "0-3", **spec) -> dict:
    job_id = cluster.submit({"command": command, "labels": {"pool": pool}, "array": array, **spec})
    return cluster.wait_job(job_id, timeout=90)


def test_elements_share_one_sandbox_and_the_attack_reads_nothing(cluster, tmp_path):
    cp_home = tmp_path / "cp-home"
    cp_home.mkdir()
    for name in ("client.json", "local-tokens.json"):
        (cp_home / name).write_text(f'{{"token": "{SECRET}"}}')
    token_file = tmp_path / "join-token"
    token_file.write_text(cluster.join_token)
    worker = start(cluster, "attacked", "--token-file", str(token_file), parallel=2,
                   env={"GPULAYER_HOME": str(cp_home)})
    env = {"CP_HOME": str(cp_home), "TOKEN_FILE": str(token_file), "STATE_DIR": str(worker.state_dir),
           "AGENT_PID": str(worker.pid)}
    done = run_array(cluster, "attacked", ["sh", "-c", ATTACK + "pwd; echo mine > own.txt; cat own.txt"],
                     array="0-5", env=env)
    assert done["state"] == "succeeded", done
    for index in range(6):
        text = element_log(cluster, done["id"], index)
        assert "attack-done" in text and SECRET not in text and cluster.join_token not in text, text
        assert "READ " not in text and "STATE " not in text and "ENVIRON " not in text and "STOPPED" not in text, text
        assert "uid=0" not in text and "\nmine" in text, text
        assert f"/tasks/job-{done['id']}/" in text, text  # its own working dir, seen at its path
    log = Path(worker.log_path).read_text()
    assert log.count(f"shared_sandbox_started job_id={done['id']} ") == 1, log[-3000:]
    # The job's directory goes with its sandbox, once it lingered without elements.
    wait_for(lambda: f"shared_sandbox_ended job_id={done['id']}" in Path(worker.log_path).read_text(), 30,
             "the job's shared sandbox to end")
    assert not (worker.state_dir / "tasks" / f"job-{done['id']}").exists()


def test_another_jobs_elements_are_not_seen(cluster):
    worker = start(cluster, "pair", parallel=2)
    first = cluster.submit({"command": ["sh", "-c", "echo private > mine.txt; echo ready; exec sleep 1234.5"],
                            "labels": {"pool": "pair"}, "array": "0-0"})
    wait_for(lambda: "ready" in element_log(cluster, first, 0), 30, "the first array's element to run")
    other = next((worker.state_dir / "tasks" / f"job-{first}").iterdir())
    probe = f"ps ax -o pid,args; cat {other}/mine.txt 2>&1; ls {worker.state_dir / 'tasks'}"
    done = run_array(cluster, "pair", ["sh", "-c", probe], array="0-0")
    cluster.request("POST", f"/v1/jobs/{first}/cancel")
    text = element_log(cluster, done["id"], 0)
    assert done["state"] == "succeeded", text
    lines = [line.strip() for line in text.splitlines()]
    assert "1234.5" not in text and "private" not in lines and f"job-{first}" not in lines, text
    assert f"job-{done['id']}" in lines, text  # the tasks dir shows its own job's directory only


def test_exit_codes_a_cancels_grace_and_a_timeout_read_as_a_tasks(cluster):
    start(cluster, "codes", parallel=2)
    done = run_array(cluster, "codes", ["sh", "-c", 'exit $((GPULAYER_ARRAY_INDEX + 6))'], array="1-1")
    assert done["state"] == "failed" and done["tasks"][0]["exit_code"] == 7, done
    done = run_array(cluster, "codes", ["sh", "-c", "kill -TERM $$"], array="0-0")
    assert done["tasks"][0]["exit_code"] == 128 + 15, done
    done = run_array(cluster, "codes", ["no-such-command-here"], array="0-0")
    assert done["tasks"][0]["exit_code"] == 127, done

    marker = "sleep 4321.5"
    done = run_array(cluster, "codes", ["sh", "-c", f"{marker} & {marker} & wait"], array="0-1", timeout_seconds=1)
    assert done["state"] == "failed" and [t["exit_code"] for t in done["tasks"]] == [143, 143], done["tasks"]
    assert wait_for(lambda: not processes_running(marker), 10, "the elements' sleeps to be gone")

    trap = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 1000 & wait"
    job = cluster.submit({"command": ["sh", "-c", trap], "labels": {"pool": "codes"}, "array": "0-0"})
    wait_for(lambda: "ready" in element_log(cluster, job, 0), 30, "the trapping element to run")
    cluster.request("POST", f"/v1/jobs/{job}/cancel")
    assert cluster.wait_job(job, timeout=60)["state"] == "cancelled"
    text = wait_for(lambda: "finished:" in (t := element_log(cluster, job, 0)) and t, 30, "the element's finish")
    assert "got-term" in text and "exit code 3" in text, text
    assert wait_for(lambda: not processes_running("sleep 1000"), 10, "the element's sleep to be gone")


def test_network_none_elements_have_a_loopback_only(cluster):
    start(cluster, "netless")
    done = run_array(cluster, "netless", ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"], array="0-1",
                     network="none")
    text = element_log(cluster, done["id"], 1)
    assert done["state"] == "succeeded" and [line.strip() for line in text.splitlines()[:-1]] == ["lo"], text


def test_a_killed_agent_takes_its_jobs_sandbox_and_elements_with_it(cluster):
    worker = start(cluster, "killed", parallel=2)
    job = cluster.submit({"command": ["sh", "-c", "echo ready; exec sleep 5555.5"], "labels": {"pool": "killed"},
                          "array": "0-1"})
    wait_for(lambda: all("ready" in element_log(cluster, job, i) for i in (0, 1)), 30, "both elements to run")
    holder = f"{worker.state_dir}/tasks/job-{job} "  # in the holder's bwrap argv (--bind DIR DIR)
    assert len(processes_running("sleep 5555.5")) >= 2 and processes_running(holder)  # nsenter and sleep each
    worker.kill()  # SIGKILL: no shutdown of its own
    assert wait_for(lambda: not processes_running("sleep 5555.5") and not processes_running(holder), 15,
                    "the elements and the job's sandbox to be gone")
    cluster.request("POST", f"/v1/jobs/{job}/cancel")
