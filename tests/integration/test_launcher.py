"""Array elements forked by their job's launcher inside the shared sandbox (issue 25, item 3 c; agent/sandbox/launcher.py): a
real server, real worker processes, real bwrap. What an element gets from the launcher (user, groups, capabilities,
no new privileges, working dir, environment, exit codes, output) is what a task of its own bwrap gets; a launcher
killed mid-run fails its elements cleanly and the job's later elements still run (entered by nsenter).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
from integration_cluster import Cluster
from test_sandbox import module_cluster, processes_running

from gpulayer.testing import wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None or not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="a job's launcher needs bwrap and nsenter on Linux, and a root agent",
)

#: What a process says of its credentials and where it runs.
CREDENTIALS = (
    "id; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; "
    "tr '\\0' ' ' < /proc/$PPID/cmdline | cut -c1-200; echo; pwd; echo \"env=$FOO,$LD_GPULAYER_TEST\""
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "launcher")


def element_log(cluster: Cluster, job_id: int, index: int) -> str:
    return "\n".join(line["text"] for line in cluster.api(f"/jobs/{job_id}/logs?index={index}&limit=1000")["lines"])


def status_lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if re.match(r"(Cap\w+|NoNewPrivs|Seccomp):", line))


def test_an_element_runs_as_a_sandboxed_task_does(cluster):
    worker = cluster.start_worker("creds", labels={"pool": "creds"}, parallel=2)
    spec = {"labels": {"pool": "creds"}, "env": {"FOO": "bar", "LD_GPULAYER_TEST": "loader"}}
    array = cluster.submit({"command": ["sh", "-c", CREDENTIALS + "; echo to-stderr >&2; exit 3"], "array": "0-1", **spec})
    plain = cluster.submit({"command": ["sh", "-c", CREDENTIALS], **spec})
    done, alone = cluster.wait_job(array, timeout=90), cluster.wait_job(plain, timeout=90)
    assert done["state"] == "failed" and [t["exit_code"] for t in done["tasks"]] == [3, 3], done["tasks"]
    assert alone["state"] == "succeeded", alone
    log = Path(worker.log_path).read_text()
    assert f"launcher_ready job_id={array} " in log, log[-3000:]
    plain_text = cluster.log_text(plain)
    for index in (0, 1):
        text = element_log(cluster, array, index)
        assert "gpulayer-launcher" in text, text  # its parent is the job's launcher, not nsenter
        assert "uid=0" not in text and "groups=0" not in text and "NoNewPrivs:\t1" in text, text
        # The same user, groups, capabilities and no-new-privileges as a task in a bwrap of its own.
        assert status_lines(text) == status_lines(plain_text), (text, plain_text)
        assert text.splitlines()[0] == plain_text.splitlines()[0], (text, plain_text)
        assert f"/tasks/job-{array}/" in text and "env=bar,loader" in text and "to-stderr" in text, text
        assert "exit code 3" in text, text


def test_exit_codes_output_and_a_signal_read_as_a_tasks(cluster):
    cluster.start_worker("codes", labels={"pool": "codes"}, parallel=2)
    command = (
        'echo "out $GPULAYER_ARRAY_INDEX"; echo "err $GPULAYER_ARRAY_INDEX" >&2; '
        '[ "$GPULAYER_ARRAY_INDEX" = 2 ] && kill -KILL $$; exit $GPULAYER_ARRAY_INDEX'
    )
    job = cluster.submit({"command": ["sh", "-c", command], "labels": {"pool": "codes"}, "array": "0-2"})
    done = cluster.wait_job(job, timeout=90)
    assert done["array"]["counts"] == {"failed": 2, "succeeded": 1} and done["array"]["failed_indices"] == [1, 2], done
    assert sorted(t["exit_code"] for t in done["tasks"]) == [1, 137], done["tasks"]
    for index in range(3):
        lines = element_log(cluster, job, index).splitlines()
        assert f"out {index}" in lines and f"err {index}" in lines, lines


def test_a_killed_launcher_fails_its_elements_and_later_ones_still_run(cluster):
    worker = cluster.start_worker("lost", labels={"pool": "lost"}, parallel=2)
    command = (
        'if [ "$GPULAYER_ARRAY_INDEX" -lt 2 ]; then echo ready; sleep 3636.5 & sleep 3636.5; fi; tr "\\0" " " < /proc/$PPID/cmdline; echo; echo later'
    )
    job = cluster.submit({"command": ["sh", "-c", command], "labels": {"pool": "lost"}, "array": "0-2"})
    wait_for(lambda: all("ready" in element_log(cluster, job, i) for i in (0, 1)), 60, "both elements to run")
    found = re.search(rf"launcher_ready job_id={job} pid=(\d+)", Path(worker.log_path).read_text())
    assert found, Path(worker.log_path).read_text()[-3000:]
    assert len(processes_running("sleep 3636.5")) >= 4  # two sleeps (and their shells) each
    os.kill(int(found.group(1)), signal.SIGKILL)
    done = cluster.wait_job(job, timeout=90)
    assert done["array"]["counts"] == {"failed": 2, "succeeded": 1} and done["array"]["failed_indices"] == [0, 1], done
    assert [t["exit_code"] for t in done["tasks"]] == [137, 137], done["tasks"]
    assert "the job's launcher ended" in element_log(cluster, job, 0), element_log(cluster, job, 0)
    later = element_log(cluster, job, 2)
    assert "later" in later and "gpulayer-launcher" not in later, later  # entered by nsenter
    assert wait_for(lambda: not processes_running("sleep 3636.5"), 10, "the elements' groups to be gone")


def test_a_launcher_stopped_by_an_element_is_killed_and_the_job_goes_on(cluster):
    cluster.start_worker("stopped", labels={"pool": "stopped"}, parallel=1)
    command = 'if [ "$GPULAYER_ARRAY_INDEX" = 0 ]; then kill -STOP $PPID; fi; echo "ran $GPULAYER_ARRAY_INDEX"'
    job = cluster.submit({"command": ["sh", "-c", command], "labels": {"pool": "stopped"}, "array": "0-1"})
    done = cluster.wait_job(job, timeout=90)
    assert done["array"]["counts"] == {"failed": 1, "succeeded": 1} and done["array"]["failed_indices"] == [0], done
    assert "the job's launcher ended" in element_log(cluster, job, 0), element_log(cluster, job, 0)
    assert "ran 1" in element_log(cluster, job, 1), element_log(cluster, job, 1)
