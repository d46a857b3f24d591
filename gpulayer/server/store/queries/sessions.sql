-- The queries of scheduler/sessions.py: where a relay stream goes, and its sessions row.

-- name: relay_task --
-- The job's task a stream opens on: its running task of that index (replica, rank), or, without one,
-- its running task of the lowest index; with its worker and what the worker's agent said of the relay.
SELECT t.id AS task_id, t."index" AS "index", t.state, t.worker_id, w.name AS worker_name, w.state AS worker_state,
       w.relay, w.version
FROM tasks t
JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id AND t.state = 'running' AND (:index IS NULL OR t."index" = :index)
ORDER BY t."index", t.id
LIMIT 1;

-- name: job_task_states --
-- What a job's tasks of that index are doing (for a refusal that says why there is nothing to enter).
SELECT j.state AS job_state,
       (SELECT group_concat(DISTINCT t.state) FROM tasks t
        WHERE t.job_id = j.id AND (:index IS NULL OR t."index" = :index)) AS task_states
FROM jobs j WHERE j.id = :job_id;

-- name: insert_session --
-- A stream opened: its row.
INSERT INTO sessions (worker_id, job_id, task_id, user, kind, detail, opened_at)
VALUES (:worker_id, :job_id, :task_id, :user, :kind, :detail, :now)
RETURNING id;

-- name: close_session --
-- A stream ended: when, the bytes each way, how.
UPDATE sessions SET closed_at = :now, bytes_in = :bytes_in, bytes_out = :bytes_out, exit_code = :exit_code,
                    end_reason = :reason
WHERE id = :id AND closed_at IS NULL
RETURNING job_id, task_id, worker_id, kind, opened_at;

-- name: close_open_sessions --
-- At start: the streams a stopped control plane left open (they ended with it).
UPDATE sessions SET closed_at = :now, end_reason = 'the control plane stopped'
WHERE closed_at IS NULL
RETURNING id, job_id, task_id, worker_id, kind;
