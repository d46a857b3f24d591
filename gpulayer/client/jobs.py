"""A submitted job, followed from the client: its state, logs, waits, endpoints and outputs (`Job`)."""
from __future__ import annotations

import datetime
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

from gpulayer.client import transfers
from gpulayer.client.errors import ClientError, ServiceNotStarting, WaitTimeout
from gpulayer.client.waiting import OnWaiting, WaitingNotice, failed_starts

FINISHED_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})
LOG_WAIT_S = 10.0
QUEUED_POLL_S = 1.0  # a queued job's logs are polled this often, so a waiting reason is told in time


class JobClient(Protocol):
    """What a Job needs of its client (gpulayer.client.api.Client, which imports this module)."""

    timeout: float

    def request(self, method: str, path: str, **kwargs: Any) -> Any: ...

    def call(self, method: str, path: str, **kwargs: Any) -> Any: ...

    def get_job_events(self, job_id: int | str) -> list[dict]: ...

    def listed(self, path: str, key: str, params: dict | None = None, cursor: str = "after") -> list[dict]: ...


#: `Job.update()`'s names that make a service's rolling update (PATCH /v1/jobs/{id}/service).
SERVICE_UPDATE_FIELDS = ("image", "env", "command", "max_surge", "max_unavailable", "canary", "ready_timeout_s",
                         "drain_s")

class Job:
    """A submitted job. `info()` fetches it anew; `data` is the last copy fetched."""

    def __init__(self, client: JobClient, data: dict):
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

    def estimated_start(self) -> datetime.datetime | None:
        """When the job is expected to start (fetched anew; an aware datetime, UTC), from the control plane's
        latest forecast; None once it started, or when that cannot be known (`data["estimate_reason"]` says
        why: held, after a job that has not ended, no worker could ever run it, ...)."""
        at = self.info().get("estimated_start_at")
        return None if at is None else datetime.datetime.fromtimestamp(at, datetime.timezone.utc)

    @property
    def exit_code(self) -> int | None:
        """The exit code of the last copy fetched (None until the job finished)."""
        return self.data.get("exit_code")

    def finished(self) -> bool:
        """True once the last copy fetched is in a final state."""
        return self.data.get("state") in FINISHED_STATES

    def wait(self, timeout: float | None = None, on_waiting: OnWaiting | None = None) -> str:
        """Block until the job finishes; return its final state.

        Raises WaitTimeout after `timeout` seconds (None waits for ever). Once the
        job has waited about 3 s without starting, `on_waiting(message)` is called
        with what it waits for ("no online worker has ...", a replica's restart),
        and again whenever that changes; by default the message is logged (INFO,
        logger `gpulayer`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        notice = WaitingNotice(on_waiting)
        while self.info()["state"] not in FINISHED_STATES:
            notice.update(self.data)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {self.id} is still {self.data['state']} after {timeout:g} s")
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 1.5, 1.0)
        return self.data["state"]

    def logs(self, follow: bool = False, after: int | None = None, on_waiting: OnWaiting | None = None,
             index: int | None = None):
        """Log lines as dicts (`seq`, `task_id`, `stream`, `at`, `text`).

        Returns a list of the lines so far; with follow=True an iterator that
        yields lines as they arrive and ends when the job has finished, telling
        `on_waiting` what the job waits for as `wait()` does. `index`: the lines
        of that element of an array (or replica, or rank) alone; followed, they
        end when that element has ended.
        """
        if follow:
            return self._follow(after, WaitingNotice(on_waiting), index)
        lines: list[dict] = []
        while True:
            page = self._log_page(after, wait_s=None, index=index)
            if not page["lines"]:
                return lines
            lines.extend(page["lines"])
            after = _next_after(page, after)

    def _log_page(self, after: int | None, wait_s: float | None, index: int | None = None) -> dict:
        params: dict = {"limit": 1000}
        if after is not None:
            params["after"] = after
        if index is not None:
            params["index"] = index
        if wait_s:
            params["wait_s"] = wait_s
        timeout = self.client.timeout + (wait_s or 0)
        return self.client.call("GET", f"/jobs/{self.id}/logs", params=params, timeout=timeout)

    def _follow(self, after: int | None, notice: WaitingNotice, index: int | None = None) -> Iterator[dict]:
        while True:
            queued = self.data.get("state") in ("queued", "waiting")
            page = self._log_page(after, wait_s=QUEUED_POLL_S if queued else LOG_WAIT_S, index=index)
            if not page["lines"] and page.get("retry_after_s"):  # the server had too many followers parked
                time.sleep(min(float(page["retry_after_s"]), LOG_WAIT_S))
            yield from page["lines"]
            after = _next_after(page, after)
            if "ended" in page:  # the server says when the job (element) has ended and no line will come
                if page["ended"]:
                    if index is None:
                        self.info()  # `data` is the job as it ended, as wait() leaves it
                    return
                if page["lines"]:
                    continue  # lines arrive: the job runs, there is nothing to tell of what it waits for
                self.info()  # a quiet page: what the job waits for now, for `on_waiting`
            # A server from before `ended`: the job is read after every page, not only empty ones:
            # the line that ends a job would otherwise be followed by a long-poll that nothing wakes.
            elif self.info()["state"] in FINISHED_STATES or (index is not None and self._element_ended(index)):
                yield from self.logs(after=after, index=index)
                return
            notice.update(self.data)

    def cancel(self, index: int | None = None) -> dict:
        """Cancel the job (every task, every replica, every element of an array), or with `index` one element
        of an array; returns the Job (with `index`, its tasks are that element's)."""
        body = None if index is None else {"index": index}
        answer = self.client.call("POST", f"/jobs/{self.id}/cancel", json=body)
        if index is None:
            self.data = answer
        return answer

    def hold(self) -> dict:
        """Hold the job (Slurm's `scontrol hold`): it does not start (an array's elements not yet started do
        not) until `release()`; returns the Job."""
        self.data = self.client.call("POST", f"/jobs/{self.id}/hold", json=None)
        return self.data

    def release(self) -> dict:
        """End the job's hold (`scontrol release`): it runs once nothing else keeps it; returns the Job."""
        self.data = self.client.call("POST", f"/jobs/{self.id}/release", json=None)
        return self.data

    def requeue(self, index: int | None = None, hold: bool = False) -> dict:
        """Run the job again (`scontrol requeue`), as a new attempt not counted against its retries: a running
        one is signalled, given its grace and queued again; one that ended runs again. `index`: one element
        of an array; `hold`: held once queued (`scontrol requeuehold`). Returns the Job."""
        body: dict = {"index": index} if index is not None else {}
        if hold:
            body["hold"] = True
        self.data = self.client.call("POST", f"/jobs/{self.id}/requeue", json=body or None)
        return self.data

    def update(self, **changes) -> dict:
        """Change the job (`scontrol update`): `name`, `priority` (a number or a class name; above the
        project's ceiling only for admins), `timeout_seconds` (seconds or a duration's text; a running
        attempt's deadline becomes its start plus it, heard by its worker within a heartbeat). Returns the Job.

        A service's rolling update instead (docs/services.md, "Rolling updates"): any of `image` (a name a
        worker has cached, an OCI archive or layout here, uploaded, or the JobSpec's object), `env` ({name:
        value}, None removes one), `command` (argv), with `max_surge`, `max_unavailable`, `canary` (1-99),
        `ready_timeout_s`, `drain_s`; returns the service's revisions (`service()`). Not both kinds at once."""
        rolling = set(changes) & set(SERVICE_UPDATE_FIELDS)
        if not rolling:
            self.data = self.client.call("PATCH", f"/jobs/{self.id}", json=changes)
            return self.data
        if rolling != set(changes):
            raise ValueError(f"{', '.join(sorted(set(changes) - rolling))}: not with a service's rolling update "
                             f"({', '.join(sorted(rolling))}): call update() twice")
        if isinstance(changes.get("image"), str):
            from gpulayer.client.images import prepare_image
            changes = {**changes, "image": prepare_image(self.client, changes["image"], transfers.upload_file,
                                                         transfers.has_artifact)}
        return self.client.call("PATCH", f"/jobs/{self.id}/service", json=changes)

    def service(self) -> dict:
        """A service's revisions: the one it serves, the update under way (`rollout`), its replicas by revision,
        its updates newest first (GET /v1/jobs/{id}/service)."""
        return self.client.call("GET", f"/jobs/{self.id}/service")

    def promote(self) -> dict:
        """A canary's rollout goes on to every replica (`gpulayer service promote`); the service's revisions."""
        return self.client.call("POST", f"/jobs/{self.id}/service/promote", json=None)

    def rollback(self) -> dict:
        """The rolling update under way turns around to the revision served before it (`gpulayer service
        rollback`); the service's revisions."""
        return self.client.call("POST", f"/jobs/{self.id}/service/rollback", json=None)

    def exec(self, argv: list[str], *, index: int | None = None, input: bytes | None = None,
             check: bool = False) -> subprocess.CompletedProcess:
        """Run `argv` in the job's running task (element, replica or rank `index`; default its first running
        one), in the task's environment, cwd, user and sandbox, through the control plane's relay; its exit
        code and captured stdout and stderr (bytes), as subprocess.run(capture_output=True) gives them.

        `input`: bytes for its stdin (default: none, EOF at once). `check`: raise CalledProcessError on a
        non-zero exit. Raises ApiError (Forbidden: not your job; Conflict: nothing runs, or the worker
        refuses exec) or ConnectionFailed (the relay or the worker went away mid-stream).
        """
        from gpulayer.client import relay
        return relay.exec_capture(self.client, self.id, list(argv), index=index, input=input,  # type: ignore[arg-type]
                                  check=check)

    def port_forward(self, remote: int, local: int = 0, *, index: int | None = None, address: str = "127.0.0.1", on_event=None):
        """A PortForward (gpulayer/client/forward.py): connections to `address`:`local` (0: a free port, its
        `local_port`) reach port `remote` in the job's running task (element, replica or rank `index`), through
        the control plane's relay. A context manager: listening inside the with block, closed after it.
        Raises ClientError when nothing of the job (that element) runs, ApiError or ConnectionFailed when the
        relay refuses or cannot be reached, OSError when the local port cannot be bound; `on_event(text)`
        hears why a connection ended with an error."""
        from gpulayer.client.forward import PortForward, refuse_unless_running
        refuse_unless_running(self.element(index) if index is not None else self.info(), index)
        return PortForward(self.client, self.id, remote, local, address=address, index=index, on_event=on_event)  # type: ignore[arg-type]

    def element(self, index: int) -> dict:
        """The Job with only the tasks of element `index` of an array (or of that replica or rank)."""
        return self.client.call("GET", f"/jobs/{self.id}", params={"index": index})

    def _element_ended(self, index: int) -> bool:
        tasks = self.element(index)["tasks"]
        return bool(tasks) and tasks[0].get("finished_at") is not None

    def events(self) -> list[dict]:
        """Every event of the job, oldest first (its pages joined)."""
        return self.client.get_job_events(self.id)

    def endpoints(self, wait: float | None = None, on_waiting: OnWaiting | None = None,
                  max_failed_starts: int | None = None) -> list[str]:
        """A service's endpoints ["host:port", ...].

        wait=None answers at once with what is known. wait=S waits up to S
        seconds until every replica has one, telling `on_waiting` what it waits
        for as `wait()` does (a replica not placed, one restarting); raises
        WaitTimeout after that, ServiceNotStarting once a replica has been
        restarted `max_failed_starts` times meanwhile (the service goes on by
        its restart policy), and ClientError when the job ends first.
        """
        if wait is None:
            return list(self.client.call("GET", f"/jobs/{self.id}/endpoints").get("endpoints") or [])
        deadline = time.monotonic() + wait
        notice = WaitingNotice(on_waiting)
        while True:
            # The state first: a finished service's tasks keep their last endpoints.
            if self.info()["state"] in FINISHED_STATES:
                raise ClientError(f"job {self.id} ended ({self.data['state']}) before every replica had an endpoint")
            answer = self.client.call("GET", f"/jobs/{self.id}/endpoints")
            if answer.get("ready") and answer.get("endpoints"):
                return list(answer["endpoints"])
            notice.update(self.data)
            restarts, message = failed_starts(self.data)
            if max_failed_starts is not None and restarts >= max_failed_starts:
                raise ServiceNotStarting(f"job {self.id}: a replica failed to start {restarts} times"
                                         + (f" ({message})" if message else ""))
            if time.monotonic() >= deadline:
                have = len(answer.get("endpoints") or [])
                raise WaitTimeout(f"job {self.id}: not every replica had an endpoint after {wait:g} s ({have} ready)")
            time.sleep(0.2)

    def gpu_usage(self, index: int | None = None) -> list[dict]:
        """Each running task's GPUs and their newest utilization and memory, like Slurm's `sstat` (`index`: that
        element's, replica's or rank's alone): `[{task_id, index, attempt, worker_id, worker_name, gpus: [{index,
        uuid, utilization_pct, memory_used_mb, memory_total_mb, at, age_s}]}]`; a GPU not sampled yet has
        None in them. Needs the right to read the job (its logs), as `outputs`."""
        params = None if index is None else {"index": index}
        return self.client.call("GET", f"/jobs/{self.id}/gpus", params=params)["tasks"]

    def outputs(self, index: int | None = None) -> dict[str, str]:
        """{relative path: digest} of the outputs the finished tasks uploaded (`index`: that element's alone)."""
        params = None if index is None else {"index": index}
        return self.client.call("GET", f"/jobs/{self.id}/outputs", params=params)["outputs"]

    def download_outputs(self, dest: str | Path, progress: bool | None = None, index: int | None = None) -> list[Path]:
        """Download every output (`index`: of that element alone) into `dest` at its relative path; return the
        files written. An array's outputs, without `index`, land in one folder per element: `dest/<index>/<path>`
        (elements that write the same path keep their own file)."""
        params = None if index is None else {"index": index}
        answer = self.client.call("GET", f"/jobs/{self.id}/outputs", params=params)
        if index is None and answer.get("elements") is not None:
            return [path for element, found in sorted(answer["elements"].items(), key=lambda item: int(item[0]))
                    for path in transfers.download_outputs(self.client, found, Path(dest) / str(int(element)), progress)]
        return transfers.download_outputs(self.client, answer["outputs"], Path(dest), progress)

    def checkpoints(self, index: int | None = None) -> list[dict]:
        """The job's checkpoints (`index`: one element's or rank's), oldest first: id, index, attempt, kind,
        created_at, files and bytes (docs/training.md)."""
        params: dict[str, int] = {"limit": 1000}
        if index is not None:
            params["index"] = index
        return self.client.listed(f"/jobs/{self.id}/checkpoints", "checkpoints", params)

    def download_checkpoint(self, dest: str | Path, attempt: int | None = None, index: int | None = None,
                            progress: bool | None = None) -> list[Path]:
        """Download the newest checkpoint (of `attempt`; of element or rank `index`) into `dest`; the files
        written. A job with checkpoints of several elements or ranks, without `index`, gets the newest of each
        in `dest/<index>/`. Raises ClientError when there is none."""
        found = [c for c in self.checkpoints(index) if attempt is None or c["attempt"] == attempt]
        if not found:
            raise ClientError(f"job {self.id} has no checkpoint" + (f" of attempt {attempt}" if attempt else "")
                              + (f" for index {index}" if index is not None else ""))
        newest = {c["index"]: c for c in found}  # oldest first: the last of each index wins
        written: list[Path] = []
        for element, chosen in sorted(newest.items()):
            folder = Path(dest) / str(element) if index is None and len(newest) > 1 else Path(dest)
            one = self.client.call("GET", f"/jobs/{self.id}/checkpoints/{chosen['id']}")
            paths = transfers.download_outputs(self.client, {f["path"]: f["digest"] for f in one["manifest"]},  # type: ignore[arg-type]
                                               folder, progress)
            for path, entry in zip(paths, sorted(one["manifest"], key=lambda f: f["path"])):
                path.chmod(entry.get("mode", 0o644) & 0o777 or 0o600)
            written += paths
        return written


def _next_after(page: dict, after: int | None) -> int | None:
    if page.get("next") is not None:
        return page["next"]
    if page["lines"]:
        return page["lines"][-1]["seq"]
    return after

