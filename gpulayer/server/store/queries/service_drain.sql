-- The queries of scheduler/service_drain.py: a replica leaving its service (scale-down, a rolling update).

-- name: drain_task --
-- Replica :task_id leaves the ingress's set now and is stopped by :deadline at the latest; a task already
-- draining keeps its first deadline (no row back: not a live task of a running service, or being stopped).
UPDATE tasks SET drain_deadline = :deadline, drain_started_at = :now
WHERE id = :task_id AND state IN ('assigned', 'running') AND cancel_requested = 0 AND drain_deadline IS NULL
  AND job_id IN (SELECT id FROM jobs WHERE kind = 'service' AND state = 'running')
RETURNING id, job_id, "index", worker_id, state;

-- name: drain_queued_task --
-- A replica not placed yet has nothing in flight: it ends now, cancelled (nothing to stop on a worker).
UPDATE tasks SET state = 'cancelled', reason = 'drained', finished_at = :now, drain_deadline = :now,
                 drain_started_at = :now
WHERE id = :task_id AND state = 'queued'
  AND job_id IN (SELECT id FROM jobs WHERE kind = 'service' AND state IN ('queued', 'running'))
RETURNING id, job_id, "index";

-- name: draining_tasks --
-- The replicas draining now and not yet told to stop, soonest deadline first.
SELECT id, job_id, "index", worker_id, drain_deadline, drain_started_at, cancel_requested
FROM tasks INDEXED BY tasks_draining
WHERE drain_deadline IS NOT NULL AND state IN ('assigned', 'running')
ORDER BY drain_deadline;

-- name: stop_drained_task --
-- A draining replica's worker is told to stop it (its signal and grace, as a cancel): no request is left in
-- flight to it, or its deadline passed.
UPDATE tasks SET cancel_requested = 1, reason = 'drained'
WHERE id = :task_id AND drain_deadline IS NOT NULL AND state IN ('assigned', 'running') AND cancel_requested = 0
RETURNING id, job_id, worker_id;

-- name: task_drain --
-- Whether task :task_id was draining when it ended (its end then leaves its service as it is).
SELECT drain_deadline FROM tasks WHERE id = :task_id AND drain_deadline IS NOT NULL;
