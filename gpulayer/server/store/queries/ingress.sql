-- The queries of scheduler/ingress.py: a service's ingress setting and the replicas it proxies to.

-- name: ingress_job --
-- A job's `service.ingress` block (null when it has none), its `service.autoscale` (scale to zero) and its state.
SELECT id, state, json_extract(spec, '$.service.ingress') AS ingress, json_extract(spec, '$.service.autoscale') AS autoscale
FROM jobs WHERE id = :job_id;

-- name: ingress_replicas --
-- The replicas of the job's current attempt that serve now: running, with an endpoint (set once the port
-- or the health path answers, cleared while the replica restarts), on an online worker; with what the
-- worker's agent said of the relay (the `tcp` stream kind is needed). A draining replica (service_drain.py)
-- is out: no new request goes to it.
SELECT t.id AS task_id, t."index" AS "index", t.endpoint, t.worker_id, w.name AS worker_name, w.relay, w.version,
       t.revision
FROM tasks t
JOIN jobs j ON j.id = t.job_id
JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id AND t.attempt = j.attempt AND t.state = 'running' AND t.endpoint IS NOT NULL
  AND t.drain_deadline IS NULL AND w.state = 'online'
ORDER BY t."index", t.id;
