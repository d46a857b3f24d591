-- The queries of scheduler/gauges.py: the counts /metrics reports (http/metrics.py renders them).

-- name: metrics_jobs_by_state --
-- gpulayer_jobs{state}.
SELECT state, count(*) AS n FROM jobs GROUP BY state;

-- name: metrics_workers_by_state --
-- gpulayer_workers{state}.
SELECT state, count(*) AS n FROM workers GROUP BY state;

-- name: metrics_queue_by_labels --
-- gpulayer_queue_depth{labels}: queued tasks by the labels their job asks for.
SELECT j.labels, count(*) AS n FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'queued' GROUP BY j.labels;

-- name: metrics_leases_expired --
-- gpulayer_leases_expired_total: tasks lost to an expired lease, ever (not to a revocation or deregistration).
SELECT count(*) AS n FROM events WHERE kind = 'task_lost' AND json_extract(data, '$.lease_expired') = 1;

-- name: metrics_artifact_bytes --
-- gpulayer_artifact_store_bytes.
SELECT coalesce(sum(size), 0) AS bytes, count(*) AS n FROM artifacts;

-- name: metrics_workers_cordoned --
-- gpulayer_workers_cordoned{state}: workers out of service, by cordon state (not gone).
SELECT c.state, count(*) AS n FROM worker_cordons c JOIN workers w ON w.id = c.worker_id
WHERE w.state <> 'gone' GROUP BY c.state;

-- name: metrics_gpus_unhealthy --
-- gpulayer_gpus_unhealthy: unhealthy GPUs of the workers not gone.
SELECT count(*) AS n FROM worker_gpus g JOIN workers w ON w.id = g.worker_id
WHERE g.healthy = 0 AND w.state <> 'gone';
