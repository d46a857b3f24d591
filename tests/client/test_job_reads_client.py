"""The client's job reads against a real control plane and worker: `logs(follow=True)` ends on the log
page's `ended` without reading the job after every page (and still ends against a server from before
`ended`), and choosing jobs by name and age (`job list`, `job cancel`) pages in only the jobs that match
(and still chooses right against a server that ignores those filters)."""
from __future__ import annotations

import fnmatch
import uuid

import pytest

import gpulayer as gl
from gpulayer.cli import selection

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def client(cluster):
    with gl.connect(url=cluster.url, token=cluster.client_token) as c:
        yield c


def recorded(client, answer_as=None) -> list[tuple[str, str, dict, dict]]:
    """Every call the client makes from now on: (method, path, params, answer); `answer_as(path, params,
    answer)` may rewrite an answer, as an older server would have sent it."""
    calls: list[tuple[str, str, dict, dict]] = []
    real = client.call

    def call(method, path, **kwargs):
        params = dict(kwargs.get("params") or {})
        answer = real(method, path, **kwargs)
        if answer_as is not None:
            answer = answer_as(path, params, answer)
        calls.append((method, path, params, answer))
        return answer
    client.call = call
    return calls


def _stdout(lines) -> list[str]:
    return [line["text"].rstrip("\n") for line in lines if line["stream"] == "stdout"]


COUNT = "for i in $(seq 1 40); do echo line $i; done; sleep 0.5; echo last"
EXPECTED = [f"line {i}" for i in range(1, 41)] + ["last"]


def test_follow_ends_on_ended_and_reads_the_job_only_after_quiet_pages(client):
    job = client.submit({"command": ["sh", "-c", COUNT]})
    calls = recorded(client)
    assert _stdout(job.logs(follow=True)) == EXPECTED
    job_path, logs_path = f"/jobs/{job.id}", f"/jobs/{job.id}/logs"
    assert {path for _, path, _, _ in calls} <= {job_path, logs_path}
    pages = [(i, answer) for i, (_, path, _, answer) in enumerate(calls) if path == logs_path]
    assert pages[-1][1]["ended"] is True and not any(answer["ended"] for _, answer in pages[:-1])
    for i, answer in pages[:-1]:   # after a page with lines the next call is the next page, not the job
        if answer["lines"]:
            assert calls[i + 1][1] == logs_path, calls[i + 1]
    reads = [i for i, (_, path, _, _) in enumerate(calls) if path == job_path]
    quiet = [i for i, answer in pages[:-1] if not answer["lines"]]
    assert reads == [i + 1 for i in quiet] + [pages[-1][0] + 1]  # and once at the end: `data` as it ended
    assert job.data["state"] == "succeeded" and job.finished() and len(calls) == reads[-1] + 1


def test_follow_against_a_server_without_ended_reads_the_job(client):
    def older(path, params, answer):
        if path.endswith("/logs"):
            answer.pop("ended", None)
        return answer
    job = client.submit({"command": ["sh", "-c", COUNT]})
    calls = recorded(client, older)
    assert _stdout(job.logs(follow=True)) == EXPECTED
    reads = sum(1 for _, path, _, _ in calls if path == f"/jobs/{job.id}")
    pages = sum(1 for _, path, _, _ in calls if path == f"/jobs/{job.id}/logs")
    assert reads >= pages - 1 and job.data["state"] == "succeeded"  # the job read after each page, as before


def _queued_jobs(client, tag: str) -> dict[str, int]:
    """Jobs that wait for good (no worker has the label), named tag-a-N, tag-b-N and tag-other."""
    made = {}
    for name in [f"{tag}-a-{n}" for n in range(3)] + [f"{tag}-other"] + [f"{tag}-b-{n}" for n in range(3)]:
        made[name] = client.submit({"command": ["true"], "name": name, "labels": {"pool": f"{tag}-nowhere"}}).id
    return made


def test_choosing_by_name_pages_in_only_matching_jobs(client):
    tag = f"sel{uuid.uuid4().hex[:8]}"
    made = _queued_jobs(client, tag)
    try:
        calls = recorded(client)
        chosen = selection.select_jobs(client, list(selection.UNFINISHED), f"{tag}-a-*", None, 1000)
        assert [j["id"] for j in chosen] == sorted((made[f"{tag}-a-{n}"] for n in range(3)), reverse=True)
        listed = [job for _, path, _, answer in calls if path == "/jobs" for job in answer["jobs"]]
        assert listed and all(fnmatch.fnmatchcase(job["name"], f"{tag}-a-*") for job in listed)
        since = client.get_job(made[f"{tag}-other"]).data["created_at"]
        aged = selection.select_jobs(client, ["queued"], f"{tag}-*", since, 1000)
        assert [j["id"] for j in aged] == [made[f"{tag}-b-{n}"] for n in (2, 1, 0)] + [made[f"{tag}-other"]]
    finally:
        for job_id in made.values():
            client.get_job(job_id).cancel()


def test_choosing_by_name_against_a_server_that_ignores_the_filters(client):
    tag = f"old{uuid.uuid4().hex[:8]}"
    made = _queued_jobs(client, tag)
    real = client.call

    def older(method, path, **kwargs):   # a server from before `name` and `since`: it sends every job
        if path == "/jobs":
            kwargs["params"] = {k: v for k, v in kwargs["params"].items() if k not in ("name", "since")}
        return real(method, path, **kwargs)
    client.call = older
    try:
        chosen = selection.select_jobs(client, ["queued"], f"{tag}-b-?", None, 2)
        assert [j["id"] for j in chosen] == [made[f"{tag}-b-2"], made[f"{tag}-b-1"]]
        since = real("GET", f"/jobs/{made[f'{tag}-other']}")["created_at"]
        aged = selection.select_jobs(client, ["queued"], f"{tag}-*", since, 1000)
        assert [j["id"] for j in aged] == [made[f"{tag}-b-{n}"] for n in (2, 1, 0)] + [made[f"{tag}-other"]]
    finally:
        client.call = real
        for job_id in made.values():
            client.get_job(job_id).cancel()
