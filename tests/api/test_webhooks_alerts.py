"""Webhooks and alerts through the real app and a real state file (issue 28, docs/notifications.md).

Deliveries go to a real HTTP receiver on loopback (a thread of this process), driven by the outbox's own
ticks (`Notifier.tick`) on the pinned clock, so backoff is stepped, never slept through.
"""

from __future__ import annotations

import json
import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from apihelpers import bearer
from receivers import Receiver
from gpulayer.server.notify import signing
from gpulayer.server.notify.outbox import Notifier
from gpulayer.testing import wait_for


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def private_ok(config):
    config.allow_private_webhooks = True
    config.webhook_retry_base_s = 1.0
    return config


@pytest.fixture
def notifier(deps):
    n = Notifier(deps.scheduler, deps.config, deps.clock)
    yield n
    n.stop()


def deliver(notifier, until, clock=None, step: float = 0.0):
    """Tick the outbox (moving the pinned clock by `step` each time) until `until()` holds."""

    def tick():
        if clock is not None and step:
            clock.advance(step)
        notifier.tick()
        notifier.settle(30)
        return until()

    wait_for(tick, timeout=30, interval=0.02)
    notifier.flush(notifier.clock())


def user(api, client_h, name, projects=()):
    made = api.simulate_post("/v1/users", headers=client_h, json={"name": name, "projects": [{"project": p, "role": r} for p, r in projects]})
    assert made.status_code == 201, made.text
    return bearer(made.json["token"])


def submit(api, headers, **extra):
    r = api.simulate_post("/v1/jobs", headers=headers, json={"command": ["true"], **extra})
    assert r.status_code == 201, r.text
    return r.json["id"]


BAD = [
    ({"url": "ftp://93.184.215.14/x", "events": ["job.failed"]}, "url"),
    ({"url": "http://", "events": ["job.failed"]}, "url"),
    ({"url": "https://93.184.215.14/x", "events": ["job.exploded"]}, "events"),
    ({"url": "https://93.184.215.14/x", "events": []}, "events"),
    ({"url": "https://93.184.215.14/x", "events": ["job.failed"], "format": "teams"}, "format"),
    ({"url": "https://93.184.215.14/x", "events": ["job.failed"], "project": "default", "job": 1}, "job"),
    ({"url": "https://93.184.215.14/x", "events": ["job.failed"], "color": 1}, "color"),
    ({"email": "someone@example.org", "events": ["job.failed"]}, "email"),  # no --smtp-url
    ({"url": "http://127.0.0.1:9/x", "events": ["job.failed"]}, "url"),  # loopback without the flag
    ({"url": "http://10.1.2.3/x", "events": ["job.failed"]}, "url"),
    ({"url": "http://169.254.169.254/latest", "events": ["job.failed"]}, "url"),
    ({"url": "http://[::1]/x", "events": ["job.failed"]}, "url"),
]


@pytest.mark.parametrize("body,field", BAD)
def test_bad_webhooks_are_refused_and_change_nothing(api, client_h, body, field):
    r = api.simulate_post("/v1/webhooks", headers=client_h, json=body)
    assert r.status_code == 400, r.text
    assert r.json["error"]["code"] in ("invalid_field", "private_target")
    assert field in r.json["error"]["message"]
    assert api.simulate_get("/v1/webhooks", headers=client_h).json["webhooks"] == []


def test_signed_deliveries_in_order_with_stable_ids_across_retries(api, client_h, private_ok, receiver, notifier, clock):
    added = api.simulate_post(
        "/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.submitted", "job.cancelled", "job.succeeded"]}
    )
    assert added.status_code == 201, added.text
    secret = added.json["secret"]
    assert secret.startswith("whsec_") and added.json["scope"] == "all"
    assert "secret" not in api.simulate_get(f"/v1/webhooks/{added.json['id']}", headers=client_h).json
    receiver.fail = 3  # the first three tries fail: retried after 1, 2, 4 s of the pinned clock
    job = submit(api, client_h)
    assert api.simulate_post(f"/v1/jobs/{job}/cancel", headers=client_h, json={}).status_code == 200
    notifier.tick()
    notifier.settle(30)
    rows = deps_rows(notifier, "SELECT status, attempts, next_try_at, last_error FROM webhook_deliveries")
    assert rows and rows[0]["status"] == "retrying" and "500" in rows[0]["last_error"]
    deliver(notifier, lambda: len(receiver.got) == 2, clock, step=1.0)
    assert receiver.types() == ["job.submitted", "job.cancelled"]
    verifier = Verifier(secret)
    for headers, body in receiver.got:
        payload = verifier.verify(body, headers)  # raises on a bad signature
        assert payload["data"]["job_id"] == job
    ids = [h["webhook-id"] for h, _ in receiver.got]
    seq = json.loads(receiver.got[0][1])["data"]["event_id"]
    assert ids[0] == signing.message_id(added.json["id"], seq)
    done = deps_rows(notifier, "SELECT status, attempts FROM webhook_deliveries ORDER BY event_seq")
    assert [d["status"] for d in done] == ["delivered", "delivered"] and done[0]["attempts"] == 4
    listed = api.simulate_get("/v1/webhooks", headers=client_h).json["webhooks"]
    assert listed[0]["delivered"] == 2 and listed[0]["retrying"] == 0


def deps_rows(notifier, sql):
    return notifier.store.read(lambda conn: list(conn.execute(sql)))


def test_a_slack_webhook_for_one_job_and_one_project(api, client_h, private_ok, receiver, notifier, clock):
    other = user(api, client_h, "bob", [("default", "member")])
    mine = submit(api, client_h)
    theirs = submit(api, other)
    hook = api.simulate_post(
        "/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.cancelled"], "job": mine, "format": "slack"}
    ).json
    assert hook["scope"] == "job" and hook["job_id"] == mine
    for job in (theirs, mine):
        api.simulate_post(f"/v1/jobs/{job}/cancel", headers=client_h, json={})
    deliver(notifier, lambda: len(receiver.got) == 1)
    assert json.loads(receiver.got[0][1]) == {"text": f"GPUlayer job {mine} cancelled"}
    notifier.tick()
    assert len(receiver.got) == 1


def test_who_may_add_webhooks_for_what(api, client_h, private_ok, receiver):
    api.simulate_post("/v1/projects", headers=client_h, json={"name": "p1"})
    alice = user(api, client_h, "alice", [("p1", "member")])
    boss = user(api, client_h, "boss", [("p1", "manager")])
    bob = user(api, client_h, "bob", [("p1", "member")])
    job = submit(api, alice, project="p1")
    hook = {"url": receiver.url, "events": ["job.failed"]}
    assert api.simulate_post("/v1/webhooks", headers=bob, json={**hook, "job": job}).status_code == 403
    assert api.simulate_post("/v1/webhooks", headers=bob, json={**hook, "job": 999}).status_code == 404
    assert api.simulate_post("/v1/webhooks", headers=bob, json={**hook, "project": "p1"}).status_code == 403
    assert api.simulate_post("/v1/webhooks", headers=bob, json={**hook, "project": "nope"}).status_code == 404
    assert api.simulate_post("/v1/webhooks", headers=boss, json={**hook, "project": "p1"}).status_code == 201
    own = api.simulate_post("/v1/webhooks", headers=alice, json={**hook, "job": job})
    assert own.status_code == 201 and own.json["scope"] == "job"
    mine = api.simulate_post("/v1/webhooks", headers=alice, json=hook).json
    assert mine["scope"] == "user"  # a user's unscoped webhook: the jobs it submits
    assert api.simulate_get(f"/v1/webhooks/{mine['id']}", headers=bob).status_code == 404
    assert api.simulate_delete(f"/v1/webhooks/{mine['id']}", headers=bob).status_code == 404
    assert [w["id"] for w in api.simulate_get("/v1/webhooks", headers=bob).json["webhooks"]] == []
    assert len(api.simulate_get("/v1/webhooks", headers=client_h).json["webhooks"]) == 3
    assert api.simulate_delete(f"/v1/webhooks/{mine['id']}", headers=alice).status_code == 200
    assert api.simulate_get(f"/v1/webhooks/{mine['id']}", headers=alice).status_code == 404


def test_webhook_test_sends_a_signed_message_now(api, client_h, private_ok, receiver):
    hook = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.failed"]}).json
    r = api.simulate_post(f"/v1/webhooks/{hook['id']}/test", headers=client_h, json={})
    assert r.status_code == 200 and r.json["ok"] and r.json["status"] == 204
    payload = Verifier(hook["secret"]).verify(receiver.got[0][1], receiver.got[0][0])
    assert payload["type"] == "webhook.test"
    receiver.close()
    r = api.simulate_post(f"/v1/webhooks/{hook['id']}/test", headers=client_h, json={})
    assert r.status_code == 200 and not r.json["ok"] and r.json["error"]


def test_an_alert_fires_once_per_new_row(api, client_h, private_ok, receiver, notifier, clock):
    hook = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.failed"]}).json
    sql = "SELECT id, name FROM jobs WHERE state = 'queued'"
    alert = api.simulate_post("/v1/alerts", headers=client_h, json={"name": "queued", "sql": sql, "every_s": 60, "webhook": hook["id"]})
    assert alert.status_code == 201, alert.text
    first = submit(api, client_h, name="a")
    deliver(notifier, lambda: len(receiver.got) == 1)
    fired = json.loads(receiver.got[0][1])
    assert fired["type"] == "alert.fired" and fired["data"]["rows"] == [{"id": first, "name": "a"}]
    clock.advance(61)
    notifier.tick()  # the same row: nothing new
    clock.advance(61)
    second = submit(api, client_h, name="b")
    deliver(notifier, lambda: len(receiver.got) == 2)
    assert json.loads(receiver.got[1][1])["data"]["rows"] == [{"id": second, "name": "b"}]
    clock.advance(61)
    notifier.tick()
    notifier.settle(30)
    notifier.tick()
    assert len(receiver.got) == 2
    listed = api.simulate_get("/v1/alerts", headers=client_h).json["alerts"]
    assert listed[0]["fired"] == 2 and listed[0]["last_error"] is None
    assert api.simulate_delete(f"/v1/webhooks/{hook['id']}", headers=client_h).status_code == 409
    assert api.simulate_delete("/v1/alerts/queued", headers=client_h).status_code == 200
    assert api.simulate_get("/v1/alerts", headers=client_h).json["alerts"] == []


@pytest.mark.parametrize(
    "sql,why",
    [
        ("DELETE FROM jobs", "read-only"),
        ("SELECT 1; DELETE FROM jobs", "one statement"),
        ("SELECT * FROM nosuch", "no such table"),
        ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", "longer than"),
    ],
)
def test_bad_alert_queries_are_refused(api, client_h, private_ok, sql, why):
    private_ok.alert_time_limit_s = 0.2
    r = api.simulate_post("/v1/alerts", headers=client_h, json={"name": "bad", "sql": sql, "every_s": 60, "webhook": 1})
    assert r.status_code == 400 and why in r.json["error"]["message"], r.text
    assert api.simulate_get("/v1/alerts", headers=client_h).json["alerts"] == []


def test_alerts_are_for_admins(api, client_h, private_ok, receiver):
    alice = user(api, client_h, "alice", [("default", "member")])
    body = {"name": "x", "sql": "SELECT 1", "every_s": 60, "webhook": 1}
    assert api.simulate_post("/v1/alerts", headers=alice, json=body).status_code == 403
    assert api.simulate_get("/v1/alerts", headers=alice).status_code == 403
    assert api.simulate_post("/v1/alerts", headers=client_h, json=body).status_code == 400  # no webhook 1
    assert api.simulate_post("/v1/alerts", headers=client_h, json={**body, "every_s": 1}).status_code == 400


def test_the_shipped_alert_examples_are_accepted(api, client_h, private_ok, receiver):
    """docs/sql.md's "Alerts: shipped examples" pass the alert's read-only checks as written."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text()
    section = doc[doc.index("## Alerts: shipped examples") : doc.index("## Cookbook: `sqlite-utils`")]
    queries = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(queries) == 3
    hook = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.failed"]}).json
    for n, sql in enumerate(queries):
        r = api.simulate_post("/v1/alerts", headers=client_h, json={"name": f"ex{n}", "sql": sql, "webhook": hook["id"]})
        assert r.status_code == 201, r.text


def test_a_kept_alive_connection_is_reused_and_one_the_receiver_closed_is_replaced(api, client_h, private_ok, notifier, clock):
    receiver = Receiver(idle_s=0.3)
    try:
        api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.submitted"]})
        private_ok.webhook_concurrency = 1
        one = Notifier(notifier.scheduler, private_ok, notifier.clock)  # one delivery thread: one connection
        try:
            submit(api, client_h)
            submit(api, client_h)
            deliver(one, lambda: len(receiver.got) == 2)
            assert receiver.connections == 1
            wait_for(lambda: receiver.closed == 1, 10, "the receiver to close the idle connection", interval=0.05)
            submit(api, client_h)  # its try finds the kept connection closed: a new one at once, not a failed try
            deliver(one, lambda: len(receiver.got) == 3)
            assert receiver.connections == 2
            tries = deps_rows(one, "SELECT attempts FROM webhook_deliveries")
            assert [t["attempts"] for t in tries] == [1, 1, 1]
            assert one.courier.starts == 1
        finally:
            one.stop()
    finally:
        receiver.close()


def test_a_webhook_added_after_the_newest_was_removed_gets_a_new_id_and_signs_with_its_own_secret(
        api, client_h, private_ok, receiver, notifier):
    """Ids are never given again (AUTOINCREMENT), so no `webhook-id` is sent twice by two webhooks."""
    first = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.submitted"]}).json
    submit(api, client_h)
    deliver(notifier, lambda: len(receiver.got) == 1)
    assert api.simulate_delete(f"/v1/webhooks/{first['id']}", headers=client_h).status_code == 200
    second = api.simulate_post("/v1/webhooks", headers=client_h, json={"url": receiver.url, "events": ["job.submitted"]}).json
    assert second["id"] > first["id"] and second["secret"] != first["secret"]
    submit(api, client_h)
    deliver(notifier, lambda: len(receiver.got) == 2)
    Verifier(second["secret"]).verify(receiver.got[1][1], receiver.got[1][0])  # raises on a bad signature
    assert receiver.got[1][0]["webhook-id"].startswith(f"msg_gl{second['id']}e")


def test_a_submits_mailbox_is_made_in_the_jobs_own_transaction(api, client_h, config, deps, monkeypatch):
    """POST /v1/jobs with `mail` makes the job and its mailbox in one write: both, or (when the mailbox cannot
    be made) neither, so a crash or a refusal between the two never leaves a job whose mail was lost."""
    config.smtp_url = "smtp://127.0.0.1:1"
    mail = {"email": "ana@example.org", "mail_type": ["END"]}
    made = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], "mail": mail})
    assert made.status_code == 201, made.text
    rows = deps_rows_of(deps, "SELECT job_id, email FROM webhooks")
    assert rows == [{"job_id": made.json["id"], "email": "ana@example.org"}]

    from gpulayer.server.errors import InvalidRequest
    from gpulayer.server.notify import targets

    def refuse(*args, **kwargs):
        raise InvalidRequest("mail.email: refused here", field="mail")
    monkeypatch.setattr(targets, "add_webhook", refuse)
    refused = api.simulate_post("/v1/jobs", headers=client_h, json={"command": ["true"], "mail": mail})
    assert refused.status_code == 400, refused.text
    assert deps_rows_of(deps, "SELECT count(*) AS n FROM jobs") == [{"n": 1}]  # the refused submit left no job


def deps_rows_of(deps, sql):
    return deps.store.read(lambda conn: [dict(r) for r in conn.execute(sql)])
