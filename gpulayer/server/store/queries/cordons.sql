-- The queries of scheduler/cordons.py: cordon, drain, uncordon.

-- name: workers_named --
-- The workers an operator names (an id, or a name): gone ones last, newest first.
SELECT id, name, state FROM workers
WHERE id = CAST(:ref AS INTEGER) OR name = :ref
ORDER BY state = 'gone', id DESC;

-- name: cordon_worker --
-- Cordon or drain a worker: its row in worker_cordons, replaced (a drain of a drained worker
-- starts again; its tasks are already gone, so upkeep marks it drained at once).
INSERT INTO worker_cordons (worker_id, state, reason, since, deadline)
VALUES (:worker_id, :state, :reason, :now, :deadline)
ON CONFLICT (worker_id) DO UPDATE
SET state = excluded.state, reason = excluded.reason, deadline = excluded.deadline, drained_at = NULL,
    since = CASE WHEN worker_cordons.state = excluded.state THEN worker_cordons.since ELSE excluded.since END
RETURNING worker_id, state, reason, since, deadline;

-- name: uncordon_worker --
-- Put a worker back into service.
DELETE FROM worker_cordons WHERE worker_id = :worker_id RETURNING worker_id, state, reason;

-- name: worker_cordon --
-- One worker's cordon, if any.
SELECT worker_id, state, reason, since, deadline, drained_at FROM worker_cordons WHERE worker_id = :worker_id;

-- name: draining_workers --
-- Upkeep: the draining workers, how many tasks each still holds, and whether its deadline passed.
SELECT c.worker_id, c.deadline,
       (SELECT count(*) FROM tasks t WHERE t.worker_id = c.worker_id AND t.state IN ('assigned', 'running')) AS active,
       (c.deadline IS NOT NULL AND c.deadline <= :now) AS due
FROM worker_cordons c INDEXED BY worker_cordons_draining
WHERE c.state = 'draining';

-- name: drain_due_tasks --
-- A drain's deadline passed: the worker's active tasks not already being stopped (a cancel, a
-- preemption, a GPU gone bad), each with whether its job is a gang (placed again whole).
SELECT t.id, t.job_id, t.attempt, t.state, j.gang
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running') AND t.cancel_requested = 0
  AND j.state IN ('queued', 'running') AND j.attempt = t.attempt
ORDER BY t.id;

-- name: requeue_drained_task --
-- A task a drain's deadline stopped goes back to the queue, same attempt, holding nothing
-- (an operator's maintenance uses up no attempt); its worker is told to stop it.
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL, ahead = 0,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL, reason = 'worker_drained'
WHERE id = :task_id AND worker_id = :worker_id AND state IN ('assigned', 'running') AND cancel_requested = 0
RETURNING id, job_id;

-- name: mark_drained --
-- A draining worker that holds no task any more is drained.
UPDATE worker_cordons SET state = 'drained', drained_at = :now, deadline = NULL
WHERE worker_id = :worker_id AND state = 'draining'
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running'))
RETURNING worker_id;
