"""What `gpulayer submit` refuses, it refuses before anything is made (issue 36 items 22 and 23), against a
real server and workers: `--mail-type` on a control plane without --smtp-url was checked after the job was
submitted ("job 38 was submitted, but its mail was refused", exit 1, the job running: a script that
retries submits twice); now the mailbox rides on the submit and both are refused at once, exit 2, no job.
Over plain HTTP too: POST /v1/jobs with `mail` beside the spec is 400, and no job is made."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)


def _job_count(cluster) -> int:
    return cluster.sql("SELECT count(*) FROM jobs")[0][0]


def test_mail_on_a_server_without_smtp_is_refused_before_the_job_is_made(cluster):
    before = _job_count(cluster)
    done = cluster.cli("submit", "--mail-type", "END", "--mail-user", "me@example.org", "--", "true")
    assert done.returncode == 2, done
    assert "--smtp-url" in done.stderr and "nothing was submitted" in done.stderr and not done.stdout.strip(), done
    assert _job_count(cluster) == before


def test_mail_beside_the_spec_over_http_is_checked_first(cluster):
    before = _job_count(cluster)
    for mail in ({"email": "me@example.org", "mail_type": ["END"]}, {"email": "me@example.org", "bogus": 1}, "me"):
        answer = cluster.request("POST", "/v1/jobs", json={"command": ["true"], "mail": mail})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_field", answer.text
    assert _job_count(cluster) == before


@pytest.mark.parametrize("flags", [["--replicas", "2", "--restart", "on_failure", "--health-path", "/h", "--no-port"],
                                   ["--max-restarts", "3"], ["--weights", "sha256:" + "0" * 64],
                                   ["--ingress", "public"]])
def test_service_flags_without_service_are_refused_alike(cluster, flags):
    """`--replicas 2 --restart on_failure --health-path /h --no-port -- true` ran once as a batch job (its
    service settings dropped without a word) while `--ingress` alone was refused: all refused alike."""
    before = _job_count(cluster)
    done = cluster.cli("submit", *flags, "--", "true")
    assert done.returncode == 2 and "add --service" in done.stderr and flags[0] in done.stderr, done
    assert _job_count(cluster) == before


def test_a_job_file_service_takes_the_service_flags(cluster, tmp_path):
    (tmp_path / "svc.toml").write_text('command = ["true"]\n[service]\nport = false\n')
    done = cluster.cli("submit", "--dry-run", "-f", str(tmp_path / "svc.toml"), "--replicas", "2", "--", "true")
    assert done.returncode == 0 and '"replicas": 2' in done.stdout, done
