"""GET /metrics: Prometheus text format, every metric named gpulayer_*.

State gauges (jobs, workers, queue depth, artifact bytes) are the scheduler's
counts (`Scheduler.gauges()`), read from the state file at scrape time, so they
always match what SQL says; latencies are histograms observed by a middleware. With several front-end processes
(`--front-ends N`, server/multiproc/) the supervisor gives each a shared PROMETHEUS_MULTIPROC_DIR: the histograms
are kept there (prometheus_client's multiprocess mode) and any front end's scrape sums them over every process,
a dead one's included; the parked gauges are the answering front end's own.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from gpulayer.server import upkeep

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class StateCollector:
    """Asks the scheduler for the state file's counts on each scrape."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        snap = self.scheduler.gauges()
        jobs = GaugeMetricFamily("gpulayer_jobs", "Jobs by state.", labels=["state"])
        for state, n in snap["jobs"].items():
            jobs.add_metric([state], n)
        yield jobs
        workers = GaugeMetricFamily("gpulayer_workers", "Workers by state.", labels=["state"])
        for state, n in snap["workers"].items():
            workers.add_metric([state], n)
        yield workers
        cordoned = GaugeMetricFamily("gpulayer_workers_cordoned", "Workers out of service, by cordon state.",
                                     labels=["state"])
        for state in ("cordoned", "draining", "drained"):
            cordoned.add_metric([state], snap["cordoned"].get(state, 0))
        yield cordoned
        yield GaugeMetricFamily("gpulayer_gpus_unhealthy", "GPUs their agents reported unhealthy (not reset since).",
                                value=snap["gpus_unhealthy"])
        queue = GaugeMetricFamily("gpulayer_queue_depth", "Queued tasks by the labels their job asks for.",
                                  labels=["labels"])
        for labels, n in snap["queue"]:
            queue.add_metric([",".join(f"{k}={v}" for k, v in sorted(labels.items()))], n)
        yield queue
        yield CounterMetricFamily("gpulayer_leases_expired", "Tasks lost to an expired lease.",
                                  value=snap["leases_expired"])
        yield GaugeMetricFamily("gpulayer_artifact_store_bytes", "Bytes in the artifact store.",
                                value=snap["artifact_bytes"])
        yield GaugeMetricFamily("gpulayer_artifacts", "Artifacts in the store.", value=snap["artifacts"])


class LiveGauge:
    """A gauge read at scrape time (`set_function`), this process's alone: never in the multiprocess files."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self.name, self.documentation = name, documentation
        self._read: Any = lambda: 0
        registry.register(self)

    def set_function(self, read) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation, value=self._read())


class Metrics:
    """The registry, the latency histograms and the middleware that fills them."""

    def __init__(self, scheduler):
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(scheduler))
        self.registry.register(RelayCollector(scheduler.relay))
        self.registry.register(IngressCollector(scheduler.ingress))
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")   # several front ends: summed from their files
        histograms = None if shared else self.registry
        if shared:
            from prometheus_client.multiprocess import MultiProcessCollector
            self.registry.register(MultiProcessCollector(None, path=shared))
        self.requests = Histogram("gpulayer_request_seconds", "Time to answer a /v1 request.",
                                  ["method", "route", "status"], buckets=BUCKETS, registry=histograms)
        self._children: dict[tuple[str, str, str], Any] = {}   # (method, route, status): its histogram
        self.acquire = Histogram("gpulayer_acquire_seconds", "Time of one acquire transaction (no long-poll wait).",
                                 buckets=BUCKETS, registry=histograms)
        # Read at scrape time from the scheduler: create_app binds them (`parked.set_function`).
        self.parked = LiveGauge("gpulayer_parked_acquires", "Worker acquires parked on the long-poll now.",
                                self.registry)
        self.parked_log_polls = LiveGauge("gpulayer_parked_log_polls", "Log follows parked on the long-poll now.",
                                          self.registry)

    def process_request(self, req, resp):
        req.context.started = time.perf_counter()

    def process_response(self, req, resp, resource, req_succeeded):
        started = getattr(req.context, "started", None)
        if started is None:
            return
        route = req.uri_template or "unmatched"
        key = (req.method, route, resp.status[:3] if isinstance(resp.status, str) else str(resp.status))
        child = self._children.get(key)
        if child is None:   # bounded: methods x routes x statuses; labels() checks and locks, a dict does not
            child = self._children[key] = self.requests.labels(*key)
        child.observe(time.perf_counter() - started)


class MetricsResource:
    """The scrape endpoint; a client token or a metrics token (glm_)."""

    auth = ("client", "metrics")

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def on_get(self, req, resp):
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.metrics.registry)


class ReplicationCollector:
    """Replication's state at scrape time (server/replication/supervisor.py): lag, position, the child's state."""

    def __init__(self, status):
        self.status = status

    def collect(self):
        status = self.status()
        if status["lag_seconds"] is not None:
            yield GaugeMetricFamily("gpulayer_replication_lag_seconds",
                                    "Age of the oldest change not yet in the replica (0: caught up).",
                                    value=status["lag_seconds"])
        if status["replicated_txid"] is not None:
            yield GaugeMetricFamily("gpulayer_replication_replicated_txid",
                                    "The last transaction id the replica holds (Litestream's TXID).",
                                    value=status["replicated_txid"])
        yield GaugeMetricFamily("gpulayer_replication_local_txid",
                                "The last transaction id Litestream took from the WAL.", value=status["local_txid"])
        state = GaugeMetricFamily("gpulayer_replication_state", "The Litestream child's state (1 for the current one).",
                                  labels=["state"])
        for name in ("running", "restarting", "fenced", "stopped"):
            state.add_metric([name], 1.0 if status["state"] == name else 0.0)
        yield state
        yield CounterMetricFamily("gpulayer_replication_restarts", "Times the Litestream child was restarted.",
                                  value=status["restarts"])


class UpkeepCollector:
    """Each upkeep job's runs, failures and last duration (server/upkeep.py `Stats`), by job name."""

    def __init__(self, stats: upkeep.Stats):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        jobs = self.stats.snapshot()
        runs = CounterMetricFamily("gpulayer_upkeep_runs", "Runs of an upkeep job, failed ones included.",
                                   labels=["job"])
        failures = CounterMetricFamily("gpulayer_upkeep_failures", "Runs of an upkeep job that raised (logged as "
                                       "upkeep_job_failed).", labels=["job"])
        duration = GaugeMetricFamily("gpulayer_upkeep_last_duration_seconds", "How long an upkeep job's last run "
                                     "took.", labels=["job"])
        for name, job in jobs.items():
            runs.add_metric([name], job.runs)
            failures.add_metric([name], job.failures)
            duration.add_metric([name], job.last_duration_s)
        yield from (runs, failures, duration)


class IngressCollector:
    """Requests and bytes through the services' ingress, by job (scheduler/ingress.py `Counters`)."""

    def __init__(self, counters):
        self.counters = counters

    def collect(self):
        stats = self.counters.stats()
        yield _by_job(CounterMetricFamily, "gpulayer_ingress_requests", "Requests through a service's ingress, by job "
                      "and status class (2xx..5xx, ws: a WebSocket, broken: cut mid-answer, stalled: a client dropped "
                      "at the send deadline).", stats["requests"], "status")
        for key, direction in (("bytes_in", "towards the replicas"), ("bytes_out", "from the replicas")):
            yield _by_job(CounterMetricFamily, f"gpulayer_ingress_{key}", f"Body bytes through the ingress {direction}, "
                          "by job.", stats[key])
        yield _by_job(CounterMetricFamily, "gpulayer_ingress_retries", "Requests tried again on another replica, by job.",
                      stats["retries"])
        yield _by_job(GaugeMetricFamily, "gpulayer_ingress_held", "Requests held now for a service scaled to zero while "
                      "a replica starts (a cold start), by job.", stats["held"])
        yield _by_job(CounterMetricFamily, "gpulayer_ingress_cold_start_refused", "Requests a cold start answered 503, "
                      "by job and code (cold_start_queue_full: the held queue was full; cold_start_timeout: no replica "
                      "ready within cold_start_timeout_s).", stats["cold_refused"], "code")


def _by_job(kind, name: str, text: str, counts: dict, label: str | None = None) -> Metric:
    """A family of `counts` by job id (keys: the job id, or (job id, `label`'s value) with `label`)."""
    family = kind(name, text, labels=["job_id", label] if label else ["job_id"])
    for key, n in counts.items():
        family.add_metric([str(key[0]), key[1]] if label else [str(key)], n)
    return family


class RelayCollector:
    """The relay's counters at scrape time (scheduler/sessions.py `Wants.stats`, kept by server/relay/)."""

    def __init__(self, relay):
        self.relay = relay

    def collect(self):
        stats = self.relay.stats()
        open_ = GaugeMetricFamily("gpulayer_relay_streams", "Streams open through the relay, by kind.",
                                  labels=["kind"])
        for kind, n in stats["open"].items():
            open_.add_metric([kind], n)
        yield open_
        for key, direction in (("bytes_in", "towards the task"), ("bytes_out", "from the task")):
            family = CounterMetricFamily(f"gpulayer_relay_{key}", f"Bytes through the relay {direction}, by kind.",
                                         labels=["kind"])
            for kind, n in stats[key].items():
                family.add_metric([kind], n)
            yield family
        refused = CounterMetricFamily("gpulayer_relay_refused", "Streams the relay refused, by error code.",
                                      labels=["code"])
        for code, n in stats["refused"].items():
            refused.add_metric([code], n)
        yield refused
        yield GaugeMetricFamily("gpulayer_relay_links", "Agents connected to the relay now.", value=stats["links"])
