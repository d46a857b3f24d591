"""The Python client: `gl.connect()` to a control plane, and a `Client`'s calls to it.

Every call speaks protocol v1 (docs/protocol.md) over `requests`. A refusal
from the server raises an `ApiError` subclass that carries the server's `code`
and `message`; a server that cannot be reached raises `ConnectionFailed`.
A submitted job is a `Job` (jobs.py); where to connect comes from settings.py.
Both are re-exported here, as they were once defined here.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import requests

from gpulayer.client import transfers
from gpulayer.client.errors import (  # noqa: F401  (re-exported)
    ApiError, BadInput, ClientError, Conflict, ConnectionFailed, Forbidden, InvalidRequest, NotFound,
    ProtocolMismatch, Unauthorized, WaitTimeout, error_from_response,
)
from gpulayer.client.jobs import FINISHED_STATES, Job  # noqa: F401  (re-exported)
from gpulayer.client.settings import (  # noqa: F401  (re-exported)
    Settings, read_client_file, resolve_settings, server_configured,
)
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
from gpulayer.client.specs import job, service  # noqa: F401  (re-exported)

EVENTS_PAGE = 10_000  # events asked per page (the server's maximum; docs/protocol.md, "Pages")


def connect(url: str | None = None, token: str | None = None, ca_file: str | None = None,
            home: str | Path | None = None) -> "Client":
    """Return a Client for the configured control plane (see `resolve_settings`).

    Raises BadInput (a ClientError) when no URL is configured anywhere, or it has no scheme.
    """
    settings = resolve_settings(url, token, ca_file, home)
    if not settings.url:
        raise BadInput("no control plane configured: pass url=, set GPULAYER_URL, "
                          "or run `gpulayer up` to leave one in $GPULAYER_HOME/client.json")
    client = Client(settings.url, settings.token, settings.ca_file)
    if settings.from_file:
        client.unreachable_hint = "(found in $GPULAYER_HOME/client.json: is `gpulayer up` running?)"
    return client


def checked_url(url: str) -> str:
    """`url` without a trailing slash; BadInput when it has no http:// or https:// scheme."""
    if not re.match(r"(?i)https?://[^\s/]", url):
        example = url.split("://", 1)[-1].strip("/") or "cp.internal:8470"
        raise BadInput(f"control plane URL {url!r}: the URL needs a scheme, e.g. https://{example}")
    return url.rstrip("/")


class Client:
    """A connection to one control plane. Thread-safe enough for one thread per Client."""

    def __init__(self, url: str, token: str | None = None, ca_file: str | None = None,
                 timeout: float = 30.0):
        self.url = checked_url(url)
        self.token = token
        self.ca_file = ca_file
        self.unreachable_hint = ""
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers[PROTOCOL_HEADER] = str(PROTOCOL)
        self.session.headers["User-Agent"] = "gpulayer-client/1"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        if ca_file and not Path(ca_file).exists():
            raise BadInput(f"CA file {ca_file} (--ca-file, GPULAYER_CA_FILE): does not exist")
        self.session.verify = ca_file if ca_file else True

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled connections."""
        self.session.close()

    def request(self, method: str, path: str, *, ok: tuple = (200, 201, 204),
                timeout: float | None = None, **kwargs) -> requests.Response:
        """Send one request to `/v1{path}`; raise ApiError/ConnectionFailed unless status is in `ok`."""
        try:
            # verify per request: requests lets $REQUESTS_CA_BUNDLE override a session's verify.
            response = self.session.request(method, f"{self.url}/v1{path}", verify=self.session.verify,
                                            timeout=timeout or self.timeout, **kwargs)
        except requests.exceptions.SSLError as exc:
            raise ConnectionFailed(f"TLS failure talking to {self.url}: {_reason(exc)} "
                                   "(pass --ca-file / GPULAYER_CA_FILE for a private CA)") from exc
        except requests.exceptions.Timeout as exc:
            raise ConnectionFailed(f"{self.url} did not answer in time") from exc
        except requests.exceptions.RequestException as exc:
            raise ConnectionFailed(f"cannot reach the control plane at {self.url}: {_reason(exc)} "
                                   f"{self.unreachable_hint}".rstrip()) from exc
        if response.status_code not in ok:
            raise error_from_response(response)
        return response

    def call(self, method: str, path: str, **kwargs) -> Any:
        """`request()` and decode the JSON answer."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(f"the server sent a non-JSON answer to {method} {path}",
                           code="invalid_response", status=response.status_code) from exc

    def pages(self, path: str, params: dict | None = None, cursor: str = "after") -> Iterator[dict]:
        """Every page of a list route in turn, following each page's `next` (passed back as `cursor`) until it
        is null; a server from before pages answers one page without `next`, which is its whole list."""
        params = dict(params or {})
        while True:
            page = self.call("GET", path, params=params)
            yield page
            following = page.get("next")
            if following is None or following == params.get(cursor):  # the last page (a cursor that does not
                return                                                   # move would loop for ever)
            params[cursor] = following

    def listed(self, path: str, key: str, params: dict | None = None, cursor: str = "after") -> list[dict]:
        """Every item of a list route, its pages joined (`pages`)."""
        return [item for page in self.pages(path, params, cursor) for item in page[key]]

    def health(self) -> dict:
        """GET /v1/health (no token needed)."""
        return self.call("GET", "/health")

    # Jobs

    def submit(self, spec: dict, project: str | None = None, *, mail: dict | None = None) -> "Job":
        """Upload what the spec names by local path (source, inputs, weights), then submit it, to `project`
        (default: your only project, else `default`); `mail` ({"email", "mail_type"}: Slurm's --mail-user
        and --mail-type) adds a mailbox for the job, refused with the job (400) by a server without mail."""
        prepared = transfers.prepare_spec(self, spec)
        if project is not None:
            prepared = {**prepared, "project": project}
        if mail is not None:
            prepared = {**prepared, "mail": mail}
        return Job(self, self.call("POST", "/jobs", json=prepared))

    def estimate(self, spec: dict, project: str | None = None) -> dict:
        """What-if (Slurm's `sbatch --test-only`): when a job of this spec would start if submitted now, without
        submitting it: {"estimated_start_at" (Unix seconds or None), "estimate_reason", "workers", "runnable",
        "now"}. What it names by local path is uploaded first, as for submit; the same errors as submit."""
        prepared = transfers.prepare_spec(self, spec)
        if project is not None:
            prepared = {**prepared, "project": project}
        return self.call("POST", "/jobs/estimate", json=prepared)

    def get_job(self, job_id: int | str) -> "Job":
        """The Job with this id (NotFound when there is none)."""
        return Job(self, self.call("GET", f"/jobs/{_job_id(job_id)}"))

    def get_job_events(self, job_id: int | str) -> list[dict]:
        """Every event of job `job_id`, oldest first (its pages joined; NotFound when there is no such job)."""
        return self.listed(f"/jobs/{_job_id(job_id)}/events", "events", {"limit": EVENTS_PAGE})

    def jobs(self, state: str | None = None, limit: int = 100, before: int | None = None, *,
             all: bool = False, user: str | None = None, project: str | None = None,  # noqa: A002
             name: str | None = None, since: float | None = None) -> list[dict]:
        """Jobs newest first, as dicts: your own, or `all` you may see, or those of `user` / `project`;
        filter by `state`, `name` (a glob: `sweep-*`) and `since` (created at or after, Unix seconds).

        A server from before the `name` and `since` filters ignores them: check the jobs if it matters.
        """
        params: dict[str, object] = {"limit": limit}
        if name is not None:
            params["name"] = name
        if since is not None:
            params["since"] = since
        if all:
            params["all"] = "true"
        if user:
            params["user"] = user
        if project:
            params["project"] = project
        if state:
            params["state"] = state
        if before is not None:
            params["before"] = before
        return self.call("GET", "/jobs", params=params)["jobs"]

    def workers(self) -> list[dict]:
        """Every worker the control plane knows, as dicts."""
        return self.listed("/workers", "workers")

    def cordon_worker(self, worker: str | int, reason: str) -> dict:
        """Give the worker (id or name) no new task; what runs there goes on. Its cordon as stored."""
        return self.call("POST", f"/workers/{_segment(worker)}/cordon", json={"reason": reason})

    def drain_worker(self, worker: str | int, reason: str, timeout_s: float | None = None) -> dict:
        """Cordon the worker and mark it drained once its tasks end (or, after `timeout_s`, stop and requeue them)."""
        return self.call("POST", f"/workers/{_segment(worker)}/drain", json={"reason": reason, "timeout_s": timeout_s})

    def uncordon_worker(self, worker: str | int) -> dict:
        """Put a cordoned, draining or drained worker back into service."""
        return self.call("POST", f"/workers/{_segment(worker)}/uncordon")

    def reset_gpu(self, worker: str | int, index: int) -> dict:
        """Mark GPU `index` of the worker healthy again (after the fault was dealt with)."""
        return self.call("POST", f"/workers/{_segment(worker)}/gpus/{int(index)}/reset")

    def provisioners(self, limit: int = 100) -> dict:
        """Slurm provisioning: `provisioners` (the configuration) and `requests` (newest first)."""
        return self.call("GET", "/provisioners", params={"limit": limit})

    # Artifacts

    def upload(self, path: str | Path, progress: bool | None = None) -> str:
        """Upload a file by content; return its `sha256:<hex>` digest. Skipped when already stored."""
        return transfers.upload_file(self, Path(path), progress)

    def download(self, digest: str, dest: str | Path, progress: bool | None = None) -> Path:
        """Stream the artifact `digest` into `dest`, verifying its SHA-256."""
        return transfers.download_artifact(self, digest, Path(dest), progress)

    def has_artifact(self, digest: str) -> bool:
        """HEAD /v1/artifacts/{digest}: True when the server holds it."""
        return transfers.has_artifact(self, digest)

    # Tokens and secrets

    def create_token(self, name: str | None = None, labels: dict | None = None,
                     expires_in_s: float | None = None, *, kind: str | None = None, user: str | None = None) -> dict:
        """Mint a token bound to a name and labels: a worker join token, or `kind="client"` for `user` (yours
        unless an admin names another; its name defaults to the user's); the answer holds `token` once."""
        body: dict[str, object] = {"labels": labels or {}}
        if name is not None:
            body["name"] = name
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        if kind is not None:
            body["kind"] = kind
        if user is not None:
            body["user"] = user
        return self.call("POST", "/tokens", json=body)

    def tokens(self) -> list[dict]:
        """Minted join tokens (never their secret part)."""
        return self.listed("/tokens", "tokens")

    def revoke_token(self, jti: str) -> dict:
        """Revoke a join token: its workers are cut off at their next heartbeat."""
        return self.call("POST", f"/tokens/{jti}/revoke")

    def set_secret(self, name: str, value: str, labels: dict | None = None, project: str | None = None) -> dict:
        """Store (or replace) a project's secret (default: your only project, else `default`); jobs of that
        project that name it get it as an environment variable."""
        return self.call("PUT", f"/secrets/{name}", json={"value": value, "labels": labels or {}},
                         params=_project(project))

    def secrets(self, project: str | None = None) -> list[dict]:
        """A project's secret names and labels (never values)."""
        return self.listed("/secrets", "secrets", _project(project))

    def delete_secret(self, name: str, project: str | None = None) -> None:
        """Delete a project's secret (NotFound when there is none)."""
        self.request("DELETE", f"/secrets/{name}", params=_project(project))

    # -- notifications (docs/notifications.md) ------------------------------------

    def add_webhook(self, url: str | None = None, events: list[str] | None = None, *, email: str | None = None,
                    mail_type: list[str] | None = None, project: str | None = None, job_id: int | None = None,
                    format: str | None = None) -> dict:  # noqa: A002 - the wire's name
        """Add a webhook (`url`, `events`) or a mailbox (`email`, `events` or Slurm's `mail_type`), for one job,
        a project, or (none given) your jobs (an admin's: everything). The answer's `secret` is shown once."""
        body = {k: v for k, v in {"url": url, "events": events, "email": email, "mail_type": mail_type,
                                  "project": project, "job": job_id, "format": format}.items() if v is not None}
        return self.call("POST", "/webhooks", json=body)

    def webhooks(self) -> list[dict]:
        """Your webhooks and mailboxes (an admin's: all), with their delivery counts."""
        return self.listed("/webhooks", "webhooks")

    def remove_webhook(self, webhook_id: int) -> None:
        self.request("DELETE", f"/webhooks/{int(webhook_id)}")

    def test_webhook(self, webhook_id: int) -> dict:
        """Send a webhook a signed test message now: `ok`, `status`, `error`."""
        return self.call("POST", f"/webhooks/{int(webhook_id)}/test", json={})

    def add_alert(self, name: str, sql: str, every_s: float, *, webhook: int | None = None,
                  email: str | None = None) -> dict:
        """An alert (admins): `sql` run every `every_s`, firing to a webhook or a mail address on new rows."""
        body = {"name": name, "sql": sql, "every_s": every_s, "webhook": webhook, "email": email}
        return self.call("POST", "/alerts", json={k: v for k, v in body.items() if v is not None})

    def alerts(self) -> list[dict]:
        return self.listed("/alerts", "alerts")

    def remove_alert(self, name: str) -> None:
        self.request("DELETE", f"/alerts/{name}")

    # -- teams (docs/teams.md) --------------------------------------------------

    def whoami(self) -> dict:
        """Your user, whether an admin, your projects and roles, and the token in use."""
        return self.call("GET", "/whoami")

    def usage(self, by: str = "user", since: str | float = "30d") -> dict:
        """GPU-hours, CPU-hours, runs and jobs from the usage ledger, per `by` (user, project, job-name or
        label:KEY), over the runs that ended within `since` ("30d", "12h", or seconds): {by, since, until,
        rows}. An admin sees everyone's; a user their own and those of the projects they manage."""
        pages = list(self.pages("/usage", {"by": by, "since": str(since)}))
        return {**pages[0], "rows": [r for page in pages for r in page["rows"]], "next": None}

    def add_user(self, name: str, *, admin: bool = False, projects: list[tuple[str, str]] | None = None,
                 max_running_jobs: int | None = None, reclaim: bool = False) -> dict:
        """Add a user (admins) in `projects` [(project, "member" | "manager")]; the answer holds its client
        `token`, once. A removed user's name is refused (409 user_removed) unless `reclaim`: the old account,
        its jobs included, comes back."""
        body = {"name": name, "admin": admin, "max_running_jobs": max_running_jobs,
                "projects": [{"project": p, "role": r} for p, r in projects or []]}
        return self.call("POST", "/users", json={**body, "reclaim": True} if reclaim else body)

    def users(self) -> list[dict]:
        """Every user (admins)."""
        return self.listed("/users", "users")

    def set_user(self, name: str, **changes) -> dict:
        """Change a user's `admin` flag or `max_running_jobs` (None clears it) (admins)."""
        return self.call("PATCH", f"/users/{_segment(name)}", json=changes)

    def remove_user(self, name: str) -> dict:
        """Remove a user (admins): its client tokens stop working; its jobs stay its own."""
        return self.call("DELETE", f"/users/{_segment(name)}")

    def add_project(self, name: str, **settings) -> dict:
        """Add a project (admins): `visibility`, `gpus` (quota), `borrow`, `weight`, `max_priority`, its idle policy
        (`idle_timeout_seconds`, `idle_below_pct`, `idle_action`; docs/teams.md)."""
        return self.call("POST", "/projects", json={"name": name, **settings})

    def projects(self) -> list[dict]:
        """The projects you are in (admins: all), with their members."""
        return self.listed("/projects", "projects")

    def set_project(self, name: str, **settings) -> dict:
        """Change a project's `visibility`, `gpus`, `borrow`, `weight`, idle policy (`idle_timeout_seconds`,
        `idle_below_pct`, `idle_action`; None clears one) (admins), `max_priority` (admins, its managers)."""
        return self.call("PATCH", f"/projects/{_segment(name)}", json=settings)

    def remove_project(self, name: str) -> dict:
        """Remove a project with no job left to end (admins)."""
        return self.call("DELETE", f"/projects/{_segment(name)}")

    def set_member(self, project: str, user: str, role: str = "member") -> dict:
        """Add `user` to `project` as `role`, or change its role (the project's managers, admins)."""
        return self.call("PUT", f"/projects/{_segment(project)}/members/{_segment(user)}", json={"role": role})

    def remove_member(self, project: str, user: str) -> dict:
        """Take `user` out of `project` (the project's managers, admins)."""
        return self.call("DELETE", f"/projects/{_segment(project)}/members/{_segment(user)}")



def _project(project: str | None) -> dict:
    return {"project": project} if project else {}


def _job_id(job_id: int | str) -> int:
    try:
        return int(job_id)
    except (TypeError, ValueError):
        raise ClientError(f"a job id is a whole number, not {job_id!r}") from None


def _reason(exc: Exception) -> str:
    """The innermost readable reason of a requests exception (no URL noise)."""
    text = str(exc)
    if "BadStatusLine('\\x15\\x03" in text:  # a TLS alert record: plain HTTP to a TLS port (granian)
        return "it answers in TLS: use an https:// URL"
    for marker in ("Connection refused", "Name or service not known", "certificate verify failed",
                   "No route to host", "timed out", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return text.split("Caused by ")[-1].strip("()' ") if "Caused by" in text else text


def _segment(value: str | int) -> str:
    """A worker id or name as one URL path segment (a name may hold any character)."""
    return quote(str(value), safe="")
