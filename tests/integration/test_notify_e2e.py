"""Notifications end to end (issue 28): a real control plane process, a worker, the CLI, a webhook receiver
on loopback and a real SMTP server (aiosmtpd) in this process.

The receiver is down while jobs run and the control plane is SIGKILLed with deliveries still retrying:
after the restart every event is delivered, signed, and never twice under different ids. The delivery
process (notify/courier.py) is SIGKILLed with a try in it: it is started again and every event still
arrives, a repeat under the same id; and it dies with a SIGKILLed control plane.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from standardwebhooks.webhooks import Webhook as Verifier

from gpulayer.testing import ControlPlaneProcess, free_port, pid_alive, wait_for
from receivers import Mailbox, Receiver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    mailbox = Mailbox()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    smtp.start()
    receiver = Receiver()
    cp = ControlPlaneProcess(
        tmp_path_factory.mktemp("notify"),
        heartbeat_interval=0.5,
        lease_ttl=5,
        args=[
            "--allow-private-webhooks",
            "--webhook-retry-base",
            "0.2",
            "--smtp-url",
            f"smtp://127.0.0.1:{smtp.port}",
            "--smtp-from",
            "gpulayer@example.org",
        ],
    )
    try:
        cp.start()
        cp.start_worker("w1", parallel=4)
        yield cp, receiver, mailbox
    finally:
        cp.close()
        receiver.close()
        smtp.stop()


def deliveries(cp, webhook_id: int) -> list[dict]:
    with sqlite3.connect(f"file:{cp.state}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM webhook_deliveries WHERE webhook_id = ? ORDER BY event_seq", (webhook_id,))]


def test_mail_arrives_for_the_types_asked(cluster):
    cp, _, mailbox = cluster
    done = cp.cli("submit", "--mail-type", "END,FAIL", "--mail-user", "ana@example.org", "--name", "mailed", "--wait", "--", "sh", "-c", "exit 3")
    assert done.returncode == 3, done.stderr
    job = int(done.stdout.split()[0])
    wait_for(lambda: mailbox.messages, 60, "the mail")
    to, text = mailbox.messages[0]
    assert to == ["ana@example.org"]
    assert f"Subject: GPUlayer job {job} (mailed) failed (exit 3" in text and "From: gpulayer@example.org" in text
    for bad, option in (
        (["--mail-type", "FOO", "--mail-user", "ana@example.org"], "--mail-type"),
        (["--mail-user", "ana@example.org"], "--mail-type"),
        (["--mail-type", "END"], "--mail-user"),
        (["--mail-type", "END", "--mail-user", "not an address"], "--mail-user"),
    ):
        refused = cp.cli("submit", *bad, "--", "true")
        assert refused.returncode == 2 and option in refused.stderr, refused.stderr
    assert len(cp.get_json("/v1/jobs?all=true")["jobs"]) == 1  # nothing was submitted


def test_every_event_delivered_once_per_id_across_a_down_receiver_and_a_sigkill(cluster):
    cp, receiver, _ = cluster
    added = cp.cli("webhook", "add", receiver.url, "--events", "job.submitted,job.succeeded,job.failed", "--json")
    assert added.returncode == 0, added.stderr
    hook = json.loads(added.stdout)
    receiver.fail = 10**9  # down: every try answers 500
    jobs = [cp.submit({"command": ["true"], "name": f"j{n}"}) for n in range(5)]
    for job in jobs:
        cp.wait_job(job, timeout=60)
    wait_for(lambda: any(d["attempts"] >= 2 for d in deliveries(cp, hook["id"])), 60, "tries that failed and are retried")
    assert {d["status"] for d in deliveries(cp, hook["id"])} == {"retrying"}
    cp.kill()
    receiver.fail = 0  # up again, and the control plane restarted
    cp.start()
    expected = {(job, kind) for job in jobs for kind in ("job.submitted", "job.succeeded")}

    def delivered():
        return {(json.loads(b)["data"]["job_id"], json.loads(b)["type"]) for _, b in receiver.got} >= expected

    wait_for(delivered, 120, "every event delivered after the restart")
    verifier = Verifier(hook["secret"])
    ids: dict[int, set[str]] = {}
    for headers, body in receiver.got:
        payload = verifier.verify(body, headers)
        ids.setdefault(payload["data"]["event_id"], set()).add(headers["webhook-id"])
    assert all(len(found) == 1 for found in ids.values()), ids
    order = [json.loads(b)["data"]["event_id"] for _, b in receiver.got]
    assert order == sorted(order)  # in order per webhook (a repeat comes right after its first)
    wait_for(lambda: [d["status"] for d in deliveries(cp, hook["id"])] == ["delivered"] * len(ids), 30, "the deliveries written")
    listed = {w["id"]: w for w in json.loads(cp.cli("webhook", "list", "--json").stdout)}
    assert listed[hook["id"]]["delivered"] == len(ids) and listed[hook["id"]]["retrying"] == 0
    assert cp.cli("webhook", "test", str(hook["id"])).returncode == 0
    assert cp.cli("webhook", "remove", str(hook["id"])).returncode == 0


def test_an_alert_mails_its_new_rows(cluster):
    cp, _, mailbox = cluster
    before = len(mailbox.messages)
    added = cp.cli(
        "alert", "add", "named", "--every", "10s", "--email", "ops@example.org", "--sql", "SELECT id, name FROM jobs WHERE name = 'alertme'"
    )
    assert added.returncode == 0, added.stderr
    job = cp.submit({"command": ["true"], "name": "alertme"})
    wait_for(lambda: len(mailbox.messages) > before, 60, "the alert's mail")
    to, text = mailbox.messages[-1]
    assert to == ["ops@example.org"] and "GPUlayer alert named: 1 new row(s)" in text and f'"id": {job}' in text
    bad = cp.cli("alert", "add", "bad", "--every", "1m", "--email", "ops@example.org", "--sql", "DELETE FROM jobs")
    assert bad.returncode != 0 and "read-only" in bad.stderr
    assert [a["name"] for a in json.loads(cp.cli("alert", "list", "--json").stdout)] == ["named"]
    assert cp.cli("alert", "remove", "named").returncode == 0


def courier_pid(server_pid: int) -> int | None:
    """The pid of the control plane's delivery process (a child running gpulayer.server.notify.courier)."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gpulayer.server.notify.courier" in argv and pid_alive(int(child)):
                return int(child)
    return None


def test_the_delivery_process_killed_mid_batch_is_restarted_and_loses_nothing(cluster):
    cp, receiver, _ = cluster
    added = cp.cli("webhook", "add", receiver.url, "--events", "job.submitted", "--json")
    assert added.returncode == 0, added.stderr
    hook = json.loads(added.stdout)
    receiver.got.clear()
    before = receiver.arrived
    receiver.gate = threading.Event()  # each try is held at the receiver until the gate opens
    try:
        jobs = [cp.submit({"command": ["true"], "name": f"k{n}"}) for n in range(3)]
        wait_for(lambda: receiver.arrived > before and courier_pid(cp.pid), 60, "a try held at the receiver")
        first = courier_pid(cp.pid)
        os.kill(first, signal.SIGKILL)  # mid-batch: its try is at the receiver, the others queued behind it
        wait_for(lambda: not pid_alive(first), 30, "the delivery process to die")
    finally:
        receiver.gate.set()
        receiver.gate = None

    def mine() -> list[tuple[dict, bytes]]:
        return [(h, b) for h, b in list(receiver.got) if h["webhook-id"].startswith(f"msg_gl{hook['id']}e")]

    wait_for(lambda: {json.loads(b)["data"]["job_id"] for _, b in mine()} >= set(jobs), 120, "every event delivered by a new delivery process")
    second = wait_for(lambda: courier_pid(cp.pid), 30, "the new delivery process")
    assert second != first
    verifier = Verifier(hook["secret"])
    ids: dict[int, set[str]] = {}
    for headers, body in mine():
        ids.setdefault(verifier.verify(body, headers)["data"]["event_id"], set()).add(headers["webhook-id"])
    assert all(len(found) == 1 for found in ids.values()), ids  # a repeat carries the id of its first try
    order = [json.loads(b)["data"]["event_id"] for _, b in mine()]
    assert order == sorted(order) and len(order) > len(ids)  # the try held when it was killed came again
    wait_for(lambda: [d["status"] for d in deliveries(cp, hook["id"])] == ["delivered"] * len(ids), 30, "the deliveries written")
    assert deliveries(cp, hook["id"])[0]["attempts"] == 2
    assert cp.cli("webhook", "remove", str(hook["id"])).returncode == 0
    # The delivery process dies with a SIGKILLed control plane (its stdin ends), and nothing is left behind.
    cp.kill()
    wait_for(lambda: not pid_alive(second), 30, "the delivery process to exit with its control plane")
    cp.start()


def test_a_webhook_added_after_the_newest_was_removed_repeats_no_id(cluster):
    """Webhook ids are never given again: a `--job` webhook added to the same receiver after the newest one
    was removed delivers the job's events again (it starts at the job's first event), under new ids, so a
    receiver that deduplicates on `webhook-id` drops none of them. Kept across a restart (the file says)."""
    cp, receiver, _ = cluster
    job = cp.submit({"command": ["true"], "name": "twice"})
    cp.wait_job(job, timeout=60)
    receiver.got.clear()
    seen: set[str] = set()   # what a deduplicating receiver has had

    def add() -> dict:
        added = cp.cli("webhook", "add", receiver.url, "--events", "job.submitted,job.succeeded", "--job", str(job), "--json")
        assert added.returncode == 0, added.stderr
        return json.loads(added.stdout)

    def fresh_ids(hook: dict) -> list[str]:
        wait_for(lambda: sum(h["webhook-id"].startswith(f"msg_gl{hook['id']}e") for h, _ in list(receiver.got)) == 2, 60,
                 f"webhook {hook['id']}'s two deliveries")
        verifier = Verifier(hook["secret"])
        got = [(h, b) for h, b in list(receiver.got) if h["webhook-id"].startswith(f"msg_gl{hook['id']}e")]
        assert [verifier.verify(b, h)["type"] for h, b in got] == ["job.submitted", "job.succeeded"]
        new = [h["webhook-id"] for h, _ in got if h["webhook-id"] not in seen]
        seen.update(new)
        return new

    first = add()
    assert len(fresh_ids(first)) == 2
    assert cp.cli("webhook", "remove", str(first["id"])).returncode == 0
    second = add()
    assert second["id"] > first["id"]
    assert len(fresh_ids(second)) == 2   # none dropped as a repeat
    assert cp.cli("webhook", "remove", str(second["id"])).returncode == 0
    cp.kill()
    cp.start()
    third = add()
    assert third["id"] > second["id"]
    assert len(fresh_ids(third)) == 2
    assert cp.cli("webhook", "remove", str(third["id"])).returncode == 0


def test_a_restored_home_gives_no_event_the_seq_of_one_its_lost_window_may_have_delivered(tmp_path):
    """The first start of a restored home moves the next event seq past what the old plane's lost window
    (changes the replica had not received) used: a webhook-id (msg_gl<webhook>e<seq>) a receiver had is
    not sent again for another event. Once: a later restart goes on from there."""
    from gpulayer.server.replication.home import RESTORED_FILE
    from gpulayer.server.replication.restore import LOST_EVENT_SEQS

    cp = ControlPlaneProcess(tmp_path, heartbeat_interval=0.5, lease_ttl=3)
    cp.init()
    (Path(cp.home) / RESTORED_FILE).write_text(json.dumps({"from": "file:///replica", "max_task_id": 0, "jobs": 0}))
    with cp:
        restored_max = cp.sql("SELECT coalesce(max(seq), 0) FROM events")[0][0]
        job = cp.submit({"command": ["true"]})
        first = cp.sql("SELECT min(seq) FROM events WHERE job_id = ?", (job,))[0][0]
        assert first > restored_max + LOST_EVENT_SEQS
        assert "first_started_at" in json.loads((Path(cp.home) / RESTORED_FILE).read_text())
        cp.kill()
        cp.start()
        newest = cp.sql("SELECT max(seq) FROM events")[0][0]
        again = cp.submit({"command": ["true"]})
        assert newest < cp.sql("SELECT min(seq) FROM events WHERE job_id = ?", (again,))[0][0] < first + LOST_EVENT_SEQS
