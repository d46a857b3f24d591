"""The Python client: `gl.connect()` to a control plane, submit jobs, follow them.

Every call speaks protocol v1 (docs/protocol.md) over `requests`. A refusal
from the server raises an `ApiError` subclass that carries the server's `code`
and `message`; a server that cannot be reached raises `ConnectionFailed`.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import requests

from gpulayer.client import transfers
from gpulayer.client.errors import (  # noqa: F401  (re-exported)
    ApiError, ClientError, Conflict, ConnectionFailed, Forbidden, InvalidRequest, NotFound,
    ProtocolMismatch, Unauthorized, WaitTimeout, error_from_response,
)
from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER, default_home
from gpulayer.client.specs import job, service  # noqa: F401  (re-exported)

FINISHED_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})
LOG_WAIT_S = 10.0


@dataclass(frozen=True)
class Settings:
    """Where a client connects: the resolved URL, token and CA file."""

    url: str | None
    token: str | None
    ca_file: str | None
    from_file: bool = False  # the URL came from client.json (left by `gpulayer up`)


def read_client_file(home: Path | str | None = None) -> dict:
    """What `gpulayer up` left in `$GPULAYER_HOME/client.json`, or {} when absent or unreadable."""
    path = Path(home).expanduser() if home else default_home()
    try:
        data = json.loads((path / "client.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_settings(url=None, token=None, ca_file=None, home=None) -> Settings:
    """Arguments first, then GPULAYER_URL/TOKEN/CA_FILE, then `$GPULAYER_HOME/client.json`.

    The token and CA file of client.json are used only for client.json's own URL,
    so a token is never sent to a server it was not made for.
    """
    url = url or os.environ.get("GPULAYER_URL") or None
    token = token or os.environ.get("GPULAYER_TOKEN") or None
    ca_file = ca_file or os.environ.get("GPULAYER_CA_FILE") or None
    saved = read_client_file(home)
    from_file = False
    if saved.get("url") and (url is None or url.rstrip("/") == str(saved["url"]).rstrip("/")):
        from_file = url is None
        url = url or saved["url"]
        token = token or saved.get("token")
        ca_file = ca_file or saved.get("ca_file")
    return Settings(url.rstrip("/") if url else None, token, ca_file, from_file)


def server_configured(url=None, home=None) -> bool:
    """True when a URL comes from an argument, GPULAYER_URL or client.json."""
    return resolve_settings(url=url, home=home).url is not None


def connect(url: str | None = None, token: str | None = None, ca_file: str | None = None,
            home: str | Path | None = None) -> "Client":
    """Return a Client for the configured control plane (see `resolve_settings`).

    Raises ClientError when no URL is configured anywhere.
    """
    settings = resolve_settings(url, token, ca_file, home)
    if not settings.url:
        raise ClientError("no control plane configured: pass url=, set GPULAYER_URL, "
                          "or run `gpulayer up` to leave one in $GPULAYER_HOME/client.json")
    client = Client(settings.url, settings.token, settings.ca_file)
    if settings.from_file:
        client.unreachable_hint = "(found in $GPULAYER_HOME/client.json: is `gpulayer up` running?)"
    return client


class Client:
    """A connection to one control plane. Thread-safe enough for one thread per Client."""

    def __init__(self, url: str, token: str | None = None, ca_file: str | None = None,
                 timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.ca_file = ca_file
        self.unreachable_hint = ""
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers[PROTOCOL_HEADER] = str(PROTOCOL)
        self.session.headers["User-Agent"] = "gpulayer-client/1"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
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

    def health(self) -> dict:
        """GET /v1/health (no token needed)."""
        return self.call("GET", "/health")

    # Jobs

    def submit(self, spec: dict) -> "Job":
        """Upload what the spec names by local path (source, inputs, weights), then submit it."""
        prepared = transfers.prepare_spec(self, spec)
        return Job(self, self.call("POST", "/jobs", json=prepared))

    def get_job(self, job_id: int | str) -> "Job":
        """The Job with this id (NotFound when there is none)."""
        return Job(self, self.call("GET", f"/jobs/{_job_id(job_id)}"))

    def jobs(self, state: str | None = None, limit: int = 100, before: int | None = None) -> list[dict]:
        """Jobs newest first, as dicts; filter by `state`."""
        params: dict[str, object] = {"limit": limit}
        if state:
            params["state"] = state
        if before is not None:
            params["before"] = before
        return self.call("GET", "/jobs", params=params)["jobs"]

    def workers(self) -> list[dict]:
        """Every worker the control plane knows, as dicts."""
        return self.call("GET", "/workers")["workers"]

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
        return self.request("HEAD", f"/artifacts/{digest}", ok=(200, 404)).status_code == 200

    # Tokens and secrets

    def create_token(self, name: str, labels: dict | None = None,
                     expires_in_s: float | None = None) -> dict:
        """Mint a worker join token bound to a name and labels; the answer holds `token` once."""
        body: dict[str, object] = {"name": name, "labels": labels or {}}
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return self.call("POST", "/tokens", json=body)

    def tokens(self) -> list[dict]:
        """Minted join tokens (never their secret part)."""
        return self.call("GET", "/tokens")["tokens"]

    def revoke_token(self, jti: str) -> dict:
        """Revoke a join token: its workers are cut off at their next heartbeat."""
        return self.call("POST", f"/tokens/{jti}/revoke")

    def set_secret(self, name: str, value: str, labels: dict | None = None) -> dict:
        """Store (or replace) a secret; jobs that name it get it as an environment variable."""
        return self.call("PUT", f"/secrets/{name}", json={"value": value, "labels": labels or {}})

    def secrets(self) -> list[dict]:
        """Secret names and labels (never values)."""
        return self.call("GET", "/secrets")["secrets"]

    def delete_secret(self, name: str) -> None:
        """Delete a secret (NotFound when there is none)."""
        self.request("DELETE", f"/secrets/{name}")


class Job:
    """A submitted job. `info()` fetches it anew; `data` is the last copy fetched."""

    def __init__(self, client: Client, data: dict):
        self.client = client
        self.data = data
        self.id = int(data["id"])

    def __repr__(self) -> str:
        return f"Job(id={self.id}, state={self.data.get('state')!r})"

    def info(self) -> dict:
        """The Job as the server has it now (see docs/protocol.md, `Job`)."""
        self.data = self.client.call("GET", f"/jobs/{self.id}")
        return self.data

    def status(self) -> str:
        """The job's state as a plain string: "queued", "running", "succeeded", ..."""
        return self.info()["state"]

    @property
    def exit_code(self) -> int | None:
        """The exit code of the last copy fetched (None until the job finished)."""
        return self.data.get("exit_code")

    def finished(self) -> bool:
        """True once the last copy fetched is in a final state."""
        return self.data.get("state") in FINISHED_STATES

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job finishes; return its final state.

        Raises WaitTimeout after `timeout` seconds (None waits for ever).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while self.info()["state"] not in FINISHED_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id} is still {self.data['state']} after {timeout:g} s")
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 1.5, 1.0)
        return self.data["state"]

    def logs(self, follow: bool = False, after: int | None = None):
        """Log lines as dicts (`seq`, `task_id`, `stream`, `at`, `text`).

        Returns a list of the lines so far; with follow=True an iterator that
        yields lines as they arrive and ends when the job has finished.
        """
        if follow:
            return self._follow(after)
        lines: list[dict] = []
        while True:
            page = self._log_page(after, wait_s=None)
            if not page["lines"]:
                return lines
            lines.extend(page["lines"])
            after = _next_after(page, after)

    def _log_page(self, after: int | None, wait_s: float | None) -> dict:
        params: dict = {"limit": 1000}
        if after is not None:
            params["after"] = after
        if wait_s:
            params["wait_s"] = wait_s
        timeout = self.client.timeout + (wait_s or 0)
        return self.client.call("GET", f"/jobs/{self.id}/logs", params=params, timeout=timeout)

    def _follow(self, after: int | None) -> Iterator[dict]:
        while True:
            page = self._log_page(after, wait_s=LOG_WAIT_S)
            if not page["lines"] and page.get("retry_after_s"):  # the server had too many followers parked
                time.sleep(min(float(page["retry_after_s"]), LOG_WAIT_S))
            yield from page["lines"]
            after = _next_after(page, after)
            # Checked after every page, not only empty ones: the line that ends a job
            # would otherwise be followed by a long-poll that nothing wakes.
            if self.info()["state"] in FINISHED_STATES:
                yield from self.logs(after=after)
                return

    def cancel(self) -> dict:
        """Cancel the job (every task, every replica); returns the Job."""
        self.data = self.client.call("POST", f"/jobs/{self.id}/cancel")
        return self.data

    def events(self) -> list[dict]:
        """The job's events, oldest first."""
        return self.client.call("GET", f"/jobs/{self.id}/events")["events"]

    def endpoints(self, wait: float | None = None) -> list[str]:
        """A service's endpoints ["host:port", ...].

        wait=None answers at once with what is known. wait=S waits up to S
        seconds until every replica has one; raises WaitTimeout after that, and
        ClientError when the job ends first.
        """
        if wait is None:
            return list(self.client.call("GET", f"/jobs/{self.id}/endpoints").get("endpoints") or [])
        deadline = time.monotonic() + wait
        while True:
            # The state first: a finished service's tasks keep their last endpoints.
            if self.info()["state"] in FINISHED_STATES:
                raise ClientError(f"job {self.id} ended ({self.data['state']}) before every replica had an endpoint")
            answer = self.client.call("GET", f"/jobs/{self.id}/endpoints")
            if answer.get("ready") and answer.get("endpoints"):
                return list(answer["endpoints"])
            if time.monotonic() >= deadline:
                have = len(answer.get("endpoints") or [])
                raise WaitTimeout(f"job {self.id}: not every replica had an endpoint after {wait:g} s ({have} ready)")
            time.sleep(0.2)

    def outputs(self) -> dict[str, str]:
        """{relative path: digest} of the outputs the finished tasks uploaded."""
        return self.client.call("GET", f"/jobs/{self.id}/outputs")["outputs"]

    def download_outputs(self, dest: str | Path, progress: bool | None = None) -> list[Path]:
        """Download every output into `dest` at its relative path; return the files written."""
        return transfers.download_outputs(self.client, self.outputs(), Path(dest), progress)


def _next_after(page: dict, after: int | None) -> int | None:
    if page.get("next") is not None:
        return page["next"]
    if page["lines"]:
        return page["lines"][-1]["seq"]
    return after


def _job_id(job_id: int | str) -> int:
    try:
        return int(job_id)
    except (TypeError, ValueError):
        raise ClientError(f"a job id is a whole number, not {job_id!r}") from None


def _reason(exc: Exception) -> str:
    """The innermost readable reason of a requests exception (no URL noise)."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "certificate verify failed",
                   "No route to host", "timed out", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return text.split("Caused by ")[-1].strip("()' ") if "Caused by" in text else text
