-- The queries of scheduler/reconcile.py: heartbeats against a state file restored from a replica.

-- name: worker_held_tasks --
-- Reconciliation: the tasks this worker holds and their state (scheduler/reconcile.py).
SELECT id, state FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running');

-- name: reconcile_task --
-- Reconciliation: a task a worker reports but does not hold, with its job's attempt.
SELECT t.id, t.job_id, t.attempt, t.state, j.attempt AS job_attempt, j.state AS job_state, j.gang, j.gpus
FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id = :task_id;

-- name: worker_running_since --
-- Reconciliation: this worker's tasks running since before the restored plane started.
SELECT id, job_id, attempt FROM tasks WHERE worker_id = :worker_id AND state = 'running' AND started_at < :before;

-- name: lose_unreported_task --
-- Reconciliation: a task running since before a restore that its worker no longer reports is lost.
UPDATE tasks SET state = 'lost', reason = 'worker_lost', finished_at = :now, endpoint = NULL
WHERE id = :task_id AND worker_id = :worker_id AND state = 'running'
RETURNING id, job_id, attempt;

-- name: reconcile_online_workers --
-- Reconciliation: the workers a restored state has online (its first start waits for their heartbeats).
SELECT id FROM workers WHERE state = 'online';
