-- The queries of scheduler/jobcontrol.py (issue 27): hold, release, begin time, update, requeue.

-- name: hold_job --
-- Put a job on hold (jobcontrol.hold): a queued one with no task started waits; its queued tasks
-- leave task_queue. RETURNING its state after.
UPDATE jobs SET hold = 1,
    state = CASE WHEN state = 'queued' AND NOT EXISTS (
                     SELECT 1 FROM tasks INDEXED BY tasks_job_active
                     WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running')
                       AND state IN ('assigned', 'running')) THEN 'waiting' ELSE state END
WHERE id = :job_id
RETURNING id, state;

-- name: hold_queued_tasks --
-- A held job's queued tasks out of task_queue (held), so acquire never reads them.
UPDATE tasks SET held = 1
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
             WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'queued' AND held = 0);

-- name: unhold_job --
-- Release a job's hold (jobcontrol.release); RETURNING it as it is then.
UPDATE jobs SET hold = 0 WHERE id = :job_id AND hold = 1
RETURNING id, state, max_running;

-- name: job_released_active --
-- A running job's tasks released (in task_queue) or active: what its %N cap counts.
SELECT count(*) AS n FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND held = 0;

-- name: begin_due --
-- Waiting jobs whose begin time has come (jobs_begin_at): their begin_at is cleared (the spec keeps
-- it), so none is read again; release_job then queues those that wait for nothing else.
UPDATE jobs SET begin_at = NULL
WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_begin_at
             WHERE state = 'waiting' AND begin_at IS NOT NULL AND begin_at <= :now ORDER BY begin_at LIMIT :n)
RETURNING id;

-- name: update_job --
-- `job update` (jobcontrol.update): its name, priority and spec (the time limit in it), each only when
-- given (NULL: kept).
UPDATE jobs SET name = CASE WHEN :set_name THEN :name ELSE name END,
                priority = coalesce(:priority, priority), spec = :spec
WHERE id = :job_id
RETURNING id;

-- name: update_task_priority --
-- A job's new priority on its tasks not yet ended, and on those in task_queue (acquire's order).
UPDATE tasks SET priority = :priority
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
             WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running'));

-- name: update_queue_priority --
UPDATE task_queue SET priority = :priority
WHERE task_id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
                  WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'queued');

-- name: request_requeue --
-- `job requeue` of a running job (jobcontrol.requeue): its running tasks (one element's with :index) are
-- stopped through their worker's heartbeat (signal, grace, SIGKILL), marked `requeued` until they end.
UPDATE tasks SET cancel_requested = 1, reason = 'requeued'
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
             WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'running'
               AND (:index IS NULL OR "index" = :index))
  AND cancel_requested = 0
RETURNING id, worker_id, "index";

-- name: worker_requeueing --
-- The tasks this worker is asked to stop for a requeue (its heartbeat names them, so that the task's log
-- says requeued, not cancelled).
SELECT id AS task_id FROM tasks INDEXED BY tasks_worker_active
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND cancel_requested = 1 AND reason = 'requeued'
ORDER BY id;

-- name: requeue_pending --
-- Tasks of a job still stopping for a requeue (running, `requeued`).
SELECT count(*) AS n FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'running'
  AND cancel_requested = 1 AND reason = 'requeued';

-- name: count_requeue --
-- A requeue of a running job: held once queued again with --hold. (Its new attempt is not counted against the
-- job's retries: requeued_attempts in outcomes.sql.)
UPDATE jobs SET hold = max(hold, :hold) WHERE id = :job_id;

-- name: job_task_stopping --
-- A task of an ended job still on its worker (its cancel or its lease not yet answered): `job requeue`
-- waits for it, so two attempts never run at once.
SELECT id, state FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state IN ('assigned', 'running')
LIMIT 1;

-- name: reopen_job --
-- `job requeue` of a job that ended: it runs again as a new attempt (not counted against its retries).
UPDATE jobs SET state = 'queued', attempt = attempt + 1, finished_at = NULL,
                exit_code = NULL, reason = NULL, hold = :hold
WHERE id = :job_id AND finished_at IS NOT NULL
RETURNING attempt, width, priority, array_size, max_running;

-- name: requeue_elements --
-- An array's elements (one with :index) run again: each a new task at its next attempt, held until
-- released (as its %N cap allows). How many.
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at, held)
SELECT :job_id, "index", max(attempt) + 1, 'queued', :priority, :now, 1
FROM tasks WHERE job_id = :job_id AND (:index IS NULL OR "index" = :index)
  AND NOT EXISTS (SELECT 1 FROM tasks a WHERE a.job_id = :job_id AND a."index" = tasks."index"
                  AND a.state IN ('queued', 'assigned', 'running'))
GROUP BY "index"
RETURNING id, "index", attempt;
