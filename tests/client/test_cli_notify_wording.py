"""Issue 36 item 26: what `gpulayer alert add` and `webhook add` say when the control plane refuses them,
against a real `server start`: the option that was wrong (`--every`, not the JSON field `every_s`), and for
a writing query what was refused (`DELETE from jobs is not allowed`), not "the explorer is read-only"."""

from __future__ import annotations

import json

import pytest

from gpulayer.testing import ControlPlaneProcess

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("notify-wording")) as plane:
        added = plane.cli("webhook", "add", "http://93.184.215.14/hook", "--events", "job.failed", "--json")
        assert added.returncode == 0, added.stderr
        yield plane, json.loads(added.stdout)["id"]


SQL = "SELECT id FROM jobs"


@pytest.mark.parametrize(
    "args,says",
    [
        (["alert", "add", "a", "--every", "5s", "--sql", SQL], "--every: must be between 10 s and 7 days"),
        (["alert", "add", "a", "--every", "30d", "--sql", SQL], "--every: must be between 10 s and 7 days"),
        (["alert", "add", "a", "--sql", "DELETE FROM jobs"], "--sql: an alert's query is read-only: DELETE from jobs is not allowed"),
        (["alert", "add", "a", "--sql", "UPDATE jobs SET priority = 1"], "--sql: an alert's query is read-only: UPDATE of jobs is not allowed"),
        (["alert", "add", "a", "--sql", "  "], "--sql: must be one SELECT"),
        (["alert", "add", "Bad Name", "--sql", SQL], "NAME: must be 1-64 lower-case letters"),
        (["alert", "add", "a", "--sql", SQL, "--webhook-id-is", "x"], "No such option"),
        (["webhook", "add", "http://93.184.215.14/x", "--events", "job.exploded"], "--events: unknown event 'job.exploded'"),
        (["webhook", "add", "http://127.0.0.1:9/x", "--events", "job.failed"], "URL: 127.0.0.1 resolves to 127.0.0.1"),
    ],
)
def test_a_refused_alert_or_webhook_names_the_option(plane, args, says):
    cp, hook = plane
    if args[:2] == ["alert", "add"] and "No such option" not in says:
        args = [*args, "--webhook", str(hook)]
    refused = cp.cli(*args)
    assert refused.returncode == 2, refused
    assert says in refused.stderr, refused.stderr
    assert "every_s" not in refused.stderr and "explorer" not in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(cp.cli("alert", "list", "--json").stdout) == []
