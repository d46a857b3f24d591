-- The queries of scheduler/autoscale.py: services whose replicas follow the ingress's load (issue 39).

-- name: autoscaled_services --
-- The live services that autoscale, each with its current attempt's live replicas as a JSON array of
-- [task id, index, state, ready (running with an endpoint), draining]. Services are few: a seek of their index.
SELECT j.id, j.attempt, j.priority, j.state, json_extract(j.spec, '$.service.autoscale') AS autoscale,
       (SELECT json_group_array(json_array(t.id, t."index", t.state,
                                           t.state = 'running' AND t.endpoint IS NOT NULL,
                                           t.drain_deadline IS NOT NULL))
        FROM tasks t INDEXED BY tasks_job_active
        WHERE t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')) AS replicas
FROM jobs j INDEXED BY jobs_services_live
WHERE j.kind = 'service' AND j.state IN ('queued', 'running')
  AND json_extract(j.spec, '$.service.autoscale') IS NOT NULL
ORDER BY j.id;

-- name: service_live_replicas --
-- A service's live replicas not draining, newest first (a scale-down drains from the front), as a decision's
-- write reads them again: queued ones (nothing to drain) before placed ones.
SELECT t.id, t."index", t.state FROM tasks t INDEXED BY tasks_job_active
JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.state IN ('queued', 'assigned', 'running') AND t.drain_deadline IS NULL
  AND t.attempt = j.attempt AND j.state IN ('queued', 'running')
ORDER BY t.state = 'queued' DESC, t.id DESC;

-- name: service_used_indices --
-- The replica indices a service's live tasks hold (draining ones included): a new replica takes the lowest free.
SELECT DISTINCT "index" FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') ORDER BY "index";

-- name: insert_service_scaling --
-- One autoscaling decision, for ops (service_scaling).
INSERT INTO service_scaling (job_id, at, from_replicas, to_replicas, why, load, in_flight, ready)
VALUES (:job_id, :now, :from_replicas, :to_replicas, :why, :load, :in_flight, :ready)
RETURNING id;

-- name: service_scaling_of --
-- A service's latest autoscaling decisions, newest first (the job read's `scaling`).
SELECT at, from_replicas, to_replicas, why, load, in_flight, ready FROM service_scaling
WHERE job_id = :job_id ORDER BY at DESC, id DESC LIMIT :limit;

-- name: service_replicas_now --
-- A service's live replicas of its current attempt now: not draining, ready (running with an endpoint, not
-- draining), draining.
SELECT coalesce(sum(t.drain_deadline IS NULL), 0) AS replicas,
       coalesce(sum(t.drain_deadline IS NULL AND t.state = 'running' AND t.endpoint IS NOT NULL), 0) AS ready,
       coalesce(sum(t.drain_deadline IS NOT NULL), 0) AS draining
FROM tasks t INDEXED BY tasks_job_active JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.state IN ('queued', 'assigned', 'running') AND t.attempt = j.attempt;
