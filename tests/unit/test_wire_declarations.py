"""The JobSpec and the Assignment are declared once (gpulayer/protocol/): validation, OpenAPI, docs and the
agent's typed Assignment all read that declaration, and a test fails when one drifts from it."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.run.reports import acquired
from gpulayer.client.specs import JOB_SETTINGS
from gpulayer.protocol.assignment import Assignment, assignments
from gpulayer.protocol.fields import json_schema, names, to_wire, wire_fields
from gpulayer.protocol.jobspec import JobSpec, ServiceSpec
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.http.app import ROUTES
from gpulayer.server.http.openapi import document
from gpulayer.server.scheduler import placement
from gpulayer.server.scheduler.spec import JOB_FIELDS, validate_job
from helpers import add_worker

ROOT = Path(__file__).resolve().parents[2]
GEN_DOCS = ROOT / "scripts" / "gen_docs.py"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", GEN_DOCS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_tables_are_the_declarations():
    done = subprocess.run([sys.executable, str(GEN_DOCS), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{done.stderr.strip()} (python scripts/gen_docs.py rewrites them)"


def test_the_check_names_a_table_that_drifted_and_the_script():
    gen = _gen_docs()
    text = (ROOT / "docs" / "protocol.md").read_text()
    drifted = text.replace("| `nodes` | 1 |", "| `nodes` | 2 |")
    assert drifted != text
    fixed, changed = gen.generated(drifted)
    assert changed == ["JobSpec"] and fixed == text


def test_every_gl_job_setting_has_a_row_in_the_python_docs():
    """gl.job() takes every JobSpec field (client/specs.py): its docs/python.md table must say each."""
    text = (ROOT / "docs" / "python.md").read_text()
    table = text[text.index("| setting | meaning |"):]
    table = table[:table.index("\n\n")]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert sorted(set(JOB_SETTINGS) - documented) == []


def test_openapi_jobspec_and_assignment_come_from_the_declarations():
    doc = document(ROUTES)
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    beside = ("project", "mail")  # beside the JobSpec in the submit's body
    assert {k: v for k, v in body["properties"].items() if k not in beside} == json_schema(JobSpec)["properties"]
    assert body["required"] == ["command"] and body["additionalProperties"] is False
    answer = doc["paths"]["/v1/worker/acquire"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["properties"]["more"]["items"] == json_schema(Assignment, closed=False)
    assert answer["properties"]["more"]["items"]["required"] == ["task_id", "job_id", "attempt", "command", "env", "gpus"]
    assert body["properties"]["gpus"]["maximum"] == 1024 and body["properties"]["cpus"]["description"]


def test_the_server_knows_the_declared_fields_and_fills_the_declared_defaults():
    assert JOB_FIELDS == set(names(JobSpec))
    spec = validate_job({"command": ["true"]})
    assert isinstance(spec, JobSpec)
    assert list(to_wire(spec)) == list(names(JobSpec))  # the stored spec's order is the declaration's
    plain = [f for f in wire_fields(JobSpec) if not f.required and f.declared.shows is None]
    assert {f.name: getattr(spec, f.name) for f in plain} == {f.name: f.default for f in plain}


@pytest.mark.parametrize("name", [f.name for f in wire_fields(JobSpec)
                                  if set(f.kinds) & {int, float} and f.declared.maximum is not None])
def test_the_server_enforces_each_declared_bound(name):
    declared = next(f for f in wire_fields(JobSpec) if f.name == name)
    context = {"array": "0-9"} if name == "max_running" else {}
    for edge in (declared.declared.minimum, declared.declared.maximum):
        assert getattr(validate_job({"command": ["true"], **context, name: edge}), name) == edge
    for beyond in (declared.declared.minimum - 1, declared.declared.maximum + 1):
        with pytest.raises(InvalidRequest, match=f"^{name}: must be between"):
            validate_job({"command": ["true"], **context, name: beyond})


def test_an_assignment_from_a_newer_or_older_server():
    newer = {"task_id": 1, "job_id": 2, "attempt": 3, "command": ["x"], "env": {}, "gpus": [0], "shiny": True,
             "service": {"replicas": 2, "health": {"http_path": "/h", "later": 1}, "weights": None}}
    got = Assignment.from_wire(newer)
    assert (got.task_id, got.attempt, got.gpus, got.log_base, got.array_size) == (1, 3, [0], 0, None)
    assert isinstance(got.service, ServiceSpec) and got.service.replicas == 2 and got.service.restart == "always"
    assert got.service.health.http_path == "/h" and got.service.health.interval_s == 10
    older = Assignment.from_wire({"task_id": 1, "job_id": 2, "command": ["x"]})  # what the agent always had to have
    assert (older.attempt, older.index, older.env, older.gpus, older.world_size) == (1, 0, {}, [], 1)
    assert list(to_wire(older)) == list(names(Assignment))
    with pytest.raises(TypeError, match="lacks command"):
        Assignment.from_wire({"task_id": 1, "job_id": 2})


def test_an_answer_carries_task_then_more():
    task = {"task_id": 1, "job_id": 2, "command": ["x"]}
    assert [a.task_id for a in assignments({"task": task, "more": [dict(task, task_id=5)]})] == [1, 5]
    assert assignments({"task": task})[0].task_id == 1  # an older server sends no `more`
    assert assignments({"task": None}) == []


def test_the_agent_logs_an_unreadable_assignment_and_runs_nothing(caplog):
    with caplog.at_level("INFO", logger="gpulayer.agent"):
        assert acquired({"task": {"task_id": 1}}) == []
    assert any(r.getMessage().startswith("assignment_unreadable error=") for r in caplog.records)


def test_an_assignment_carries_the_fields_it_shares_with_the_jobspec_from_the_stored_spec(sched):
    """placement.assignment copies every Assignment field named as a JobSpec field (but env and gpus, which it
    makes) from the stored spec, and one a spec stored before the field was declared lacks as its default."""
    shared = {f.name for f in placement.JOB_OWN_FIELDS}
    # grace_seconds: the job's within the server's --max-grace (placement.stop_grace), not a copy
    assert shared == set(names(Assignment)) & set(names(JobSpec)) - {"env", "gpus", "grace_seconds"}
    given = {"command": ["run", "it"], "outputs": ["out/"], "cpus": 1.5, "memory_mb": 64, "timeout_seconds": 9.5,
             "signal": "B:USR1@5",
             "silence_timeout_seconds": 3, "network": "none", "run_as_root": True, "checkpoint_every_seconds": 60,
             "service": {"port": False, "health": {"http_path": "/h", "failures": 2}},
             "image": {"ref": "cached-on-the-worker"}}  # a name alone: no blobs to store
    # source and inputs: digests, which need stored artifacts; a share of a GPU, a worker that shares its GPUs
    # (tests/unit/test_gpu_fractions.py)
    assert {"source", "inputs", "gpu_fraction", "gpu_memory_mb"} | set(given) >= shared
    worker = add_worker(sched, cpus=8)
    job_id = sched.submit(given)
    stored = to_wire(validate_job(given))
    got = sched.acquire(worker)
    assert got is not None and got["job_id"] == job_id
    assert {name: got[name] for name in shared} == {name: stored[name] for name in shared}
    assert got["service"]["health"] == {"http_path": "/h", "interval_s": 10, "failures": 2}

    older = {k: v for k, v in stored.items() if k not in ("network", "run_as_root", "service")}
    sched.store.write(lambda conn: conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(older), job_id)))
    again = sched.store.read(placement.assignment, got["task_id"])
    assert (again["network"], again["run_as_root"], again["service"]) == ("shared", False, None)
