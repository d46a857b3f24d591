"""/v1/webhooks and /v1/alerts (issue 28, docs/notifications.md): parse, call the Scheduler (its writes) or
gpulayer/server/notify/ (its reads), render."""

from __future__ import annotations

import json
import time

import falcon

from gpulayer.server.http import paging, wire
from gpulayer.server.notify import alerts, payloads, send, signing, targets
from gpulayer.server.store.readonly_sql import ReadOnlyDatabase


class _Notify:
    auth: tuple[str, ...] = ("client",)

    def __init__(self, deps):
        self.deps = deps
        self.store = deps.store
        self.config = deps.config


class Webhooks(_Notify):
    """Add a webhook or mailbox (owners, managers, admins, for what they may read); list one's own (admins: all)."""

    def on_post(self, req, resp):
        spec = targets.parse_webhook(wire.read_json(req), allow_private=self.config.allow_private_webhooks, smtp=bool(self.config.smtp_url))
        resp.media = self.deps.scheduler.add_webhook(req.context.principal, spec)
        resp.status = falcon.HTTP_201

    def on_get(self, req, resp):
        limit, after = paging.params(req, "/v1/webhooks")
        found, more = paging.cut(self.store.read(targets.list_webhooks, req.context.principal, after, limit + 1), limit)
        resp.media = paging.answer("webhooks", found, more, "id")


class Webhook(_Notify):
    """One webhook (its adder, admins): read, remove, or send it a test message now."""

    def on_get(self, req, resp, webhook_id):
        resp.media = self.store.read(targets.get_webhook, req.context.principal, webhook_id)

    def on_delete(self, req, resp, webhook_id):
        self.deps.scheduler.remove_webhook(req.context.principal, webhook_id)
        resp.media = {"ok": True}

    def on_post_test(self, req, resp, webhook_id):
        hook, secret = self.store.read(targets.webhook_secret, req.context.principal, self.deps.scheduler.secret_box, webhook_id)
        now = self.deps.clock()
        event = {
            "seq": 0,
            "at": now,
            "kind": "webhook_test",
            "actor": req.context.principal.actor,
            "data": {"webhook_id": webhook_id, "message": "a test message from gpulayer webhook test"},
            "job_id": None,
            "worker_id": None,
        }
        msg_id = f"msg_gl{webhook_id}test{int(now * 1000)}"
        try:
            if hook["email"]:
                if not self.config.smtp_url:
                    raise send.SendError("this control plane has no --smtp-url")
                send.mail(
                    self.config.smtp_url,
                    self.config.smtp_from,
                    hook["email"],
                    "GPUlayer webhook test",
                    json.dumps(payloads.payload_data(event), indent=2),
                    msg_id,
                    timeout=self.config.webhook_timeout_s,
                )
                status = 250
            else:
                body = (
                    payloads.body_for(hook["format"], "webhook.test", event)
                    if hook["format"] == "standard"
                    else json.dumps({"text": "GPUlayer: a test message from gpulayer webhook test"}).encode()
                )
                headers = signing.headers(secret, msg_id, int(time.time()), body) if secret else {}
                status = send.post(
                    hook["url"], body, headers, timeout=self.config.webhook_timeout_s, allow_private=self.config.allow_private_webhooks
                )
            resp.media = {"ok": True, "status": status, "error": None, "id": msg_id}
        except send.SendError as e:
            resp.media = {"ok": False, "status": e.status, "error": str(e), "id": msg_id}


class Alerts(_Notify):
    """Alerts on SQL queries: admins only (a query reads the whole state file, as the explorer's)."""

    admin_only = True

    def on_post(self, req, resp):
        spec = targets.parse_alert(wire.read_json(req), smtp=bool(self.config.smtp_url))
        alerts.check_sql(ReadOnlyDatabase(str(self.config.layout.state), time_limit_s=self.config.alert_time_limit_s), spec["sql"])
        resp.media = self.deps.scheduler.add_alert(req.context.principal, spec)
        resp.status = falcon.HTTP_201

    def on_get(self, req, resp):
        limit, after = paging.params(req, "/v1/alerts")
        found, more = paging.cut(self.store.read(targets.list_alerts, req.context.principal, after, limit + 1), limit)
        resp.media = paging.answer("alerts", found, more, "id")


class Alert(_Notify):
    admin_only = True

    def on_delete(self, req, resp, name):
        self.deps.scheduler.remove_alert(req.context.principal, name)
        resp.media = {"ok": True}
