"""What a delivery says: the Standard Webhooks body, Slack's `{"text": ...}`, a mail's subject and text.

Pure functions of (public name, event row): the delivery process (courier.py) builds each body from the
event the server hands it, and `webhook test` (http/notify_routes.py) builds its one in the request.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")


def payload_data(event: dict) -> dict:
    data = {"event_id": event["seq"], "kind": event["kind"], "at": event["at"], "actor": event["actor"]}
    for key in ("job_id", "job_name", "project", "owner", "task_id", "worker_id", "worker"):
        if event.get(key) is not None:
            data[key] = event[key]
    for key, value in event["data"].items():
        data.setdefault(key, value)
    return data


def summary(name: str, event: dict) -> str:
    """One line for people (Slack's text, a mail's subject)."""
    d = event["data"]
    job = f"job {event['job_id']}" + (f" ({event['job_name']})" if event.get("job_name") else "")
    if name == "alert.fired":
        return f"GPUlayer alert {d.get('name')}: {d.get('new')} new row(s)"
    if name.startswith("job."):
        verb = name.split(".", 1)[1]
        extra = ""
        if name in ("job.failed", "job.lost") and (d.get("reason") or d.get("exit_code") is not None):
            extra = f" (exit {d.get('exit_code')}, {d.get('reason')})"
        return f"GPUlayer {job} {verb}{extra}"
    if name.startswith("task."):
        return f"GPUlayer {job} task {event['task_id']} {name.split('.', 1)[1]}"
    what = event.get("worker") or f"worker {event['worker_id']}"
    return f"GPUlayer {what}: {name}"


def body_for(fmt: str, name: str, event: dict) -> bytes:
    if fmt == "slack":
        text = summary(name, event)
        if name == "alert.fired":
            text += "\n" + "\n".join(json.dumps(r, default=str) for r in event["data"].get("rows", [])[:20])
        return json.dumps({"text": text}).encode()
    return json.dumps({"type": name, "timestamp": iso(event["at"]), "data": payload_data(event)}, sort_keys=True, default=str).encode()


def mail_text(name: str, event: dict) -> str:
    """A mail's body: the Standard payload, indented."""
    return json.dumps({"type": name, "timestamp": iso(event["at"]), "data": payload_data(event)}, indent=2, sort_keys=True, default=str)
