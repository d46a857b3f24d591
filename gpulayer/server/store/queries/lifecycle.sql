-- The queries of scheduler/lifecycle.py: start, logs, rendezvous, finish of a task.

-- name: start_task --
-- The worker started the task's process: ownership-checked (one leased ahead now holds its room).
UPDATE tasks SET state = 'running', started_at = :now, pid = :pid, ahead = 0
WHERE id = :task_id AND worker_id = :worker_id AND state = 'assigned' AND cancel_requested = 0
RETURNING job_id, attempt;

-- name: task_owned --
-- The task as this worker holds it (no row: not this worker's task).
SELECT id, job_id, attempt, "index", state, cancel_requested, pid, reason
FROM tasks WHERE id = :task_id AND worker_id = :worker_id;

-- name: insert_log --
-- One log line; (task_id, n) makes a retried batch harmless. A line sent without
-- `n` (NULL) goes after the task's last line (the UNIQUE index finds the max).
INSERT OR IGNORE INTO logs (job_id, task_id, n, stream, at, text)
VALUES (:job_id, :task_id,
        COALESCE(:n, (SELECT COALESCE(MAX(n) + 1, 0) FROM logs WHERE task_id = :task_id)),
        :stream, :at, :text);

-- name: finish_task --
-- Record a task's result, only while this worker holds it.
UPDATE tasks
SET state = :state, exit_code = :exit_code, outcome = :outcome, reason = :reason,
    outputs = :outputs, finished_at = :now, endpoint = NULL
WHERE id = :task_id AND worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt, "index", worker_id, cancel_requested;

-- name: rendezvous_arrive --
-- A rank reports where it listens; arriving again overwrites.
INSERT INTO rendezvous (job_id, attempt, rank, task_id, address, port, arrived_at)
VALUES (:job_id, :attempt, :rank, :task_id, :address, :port, :now)
ON CONFLICT (job_id, attempt, rank) DO UPDATE
SET task_id = excluded.task_id, address = excluded.address, port = excluded.port, arrived_at = excluded.arrived_at;

-- name: rendezvous_peers --
-- The ranks of an attempt that arrived, in rank order.
SELECT rank, address, port FROM rendezvous
WHERE job_id = :job_id AND attempt = :attempt ORDER BY rank;

-- name: set_task_pid --
-- A started task reports its process id again (a retried start).
UPDATE tasks SET pid = :pid WHERE id = :task_id RETURNING id;
