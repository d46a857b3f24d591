-- The queries of scheduler/outcomes.py: what a job does when a task ends (wait, retry, end), cascades, cancel.

-- name: array_element_made --
-- Has the array's element :index its first task yet (a big array's are made BATCH a write, in order)?
SELECT 1 AS found FROM tasks INDEXED BY tasks_job WHERE job_id = :job_id AND attempt = 1 AND "index" = :index;

-- name: release_held_tasks --
-- Release up to :n held tasks of a job (-1: all), lowest index first: they join task_queue, aging
-- from now (queued_at); none of a job on hold.
UPDATE tasks SET held = 0, queued_at = :now
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_held
             WHERE job_id = :job_id AND state = 'queued' AND held = 1 ORDER BY "index" LIMIT :n)
  AND (SELECT hold FROM jobs WHERE id = :job_id) = 0  -- a held job's tasks stay out (jobcontrol.hold)
RETURNING id;

-- name: waiting_dependents --
-- The waiting jobs that wait on a job that just ended, with their condition on it: up to :n of
-- them after job :cursor, not those being cancelled already (reason set). (CROSS JOIN keeps
-- SQLite from walking every waiting job instead: the cost is this job's dependents only.)
SELECT d.job_id, d.condition FROM job_dependencies d CROSS JOIN jobs j ON j.id = d.job_id
WHERE d.after_job_id = :after_job_id AND d.job_id > :cursor AND j.state = 'waiting' AND j.reason IS NULL
ORDER BY d.job_id LIMIT :n;

-- name: release_job --
-- A waiting job whose dependencies have all ended (none ended against its condition, or
-- it would be cancelled) is queued, unless it is held or its begin time has not come (jobcontrol.py).
UPDATE jobs SET state = 'queued'
WHERE id = :job_id AND state = 'waiting' AND reason IS NULL AND hold = 0
  AND (begin_at IS NULL OR begin_at <= :now)
  AND NOT EXISTS (SELECT 1 FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
                  WHERE d.job_id = :job_id AND a.finished_at IS NULL)
RETURNING id, max_running;

-- name: job_has_active_task --
-- Has the job a task still to end (queued, held or not, assigned or running)?
SELECT 1 AS found FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') LIMIT 1;

-- name: task_element --
-- The element index and attempt of a task (an array element's retry counts its own attempts).
SELECT "index", attempt FROM tasks WHERE id = :task_id;

-- name: insert_task --
-- One queued task of a job's attempt (a replica or a rank), of the revision its job serves.
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at, revision)
VALUES (:job_id, :index, :attempt, 'queued', :priority, :now, (SELECT revision FROM jobs WHERE id = :job_id))
RETURNING id;

-- name: job_for_update --
-- The job row that task-ending decisions read.
SELECT id, state, kind, width, gang, attempt, max_attempts, retry_on, priority, array_size, max_running, reason,
       hold, begin_at, user_id, project_id
FROM jobs WHERE id = :job_id;

-- name: attempt_tasks --
-- Every task of one attempt of a job.
SELECT id, "index", state, exit_code, outcome, reason, worker_id, cancel_requested, drain_deadline
FROM tasks WHERE job_id = :job_id AND attempt = :attempt ORDER BY "index";

-- name: stop_attempt_tasks --
-- Stop the other tasks of an attempt: queued ones end now, active ones are
-- cancelled through their worker's heartbeat.
UPDATE tasks
SET state = CASE WHEN state IN ('queued', 'assigned') THEN :state ELSE state END,
    finished_at = CASE WHEN state IN ('queued', 'assigned') THEN :now ELSE finished_at END,
    reason = coalesce(reason, :reason),
    cancel_requested = CASE WHEN state = 'running' THEN 1 ELSE cancel_requested END
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('queued', 'assigned', 'running')
RETURNING id, state;

-- name: detach_running_tasks --
-- Tasks of an attempt that is being replaced: they end for the control plane now
-- (their workers are told to kill them) so that the new attempt can be placed.
UPDATE tasks
SET state = :state, finished_at = :now, reason = coalesce(reason, :reason), cancel_requested = 1, endpoint = NULL
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('queued', 'assigned', 'running')
RETURNING id, worker_id;

-- name: next_attempt --
-- Count one more attempt of a job and queue it again.
UPDATE jobs SET attempt = attempt + 1, state = 'queued'
WHERE id = :job_id AND state IN ('queued', 'running')
RETURNING attempt, width, priority;

-- name: finish_job --
-- A job ends for good, once.
UPDATE jobs SET state = :state, exit_code = :exit_code, reason = :reason, finished_at = :now
WHERE id = :job_id AND state IN ('queued', 'running', 'waiting')
RETURNING id;

-- name: mark_job_ending --
-- A job starts to be cancelled (:reason cancelled, or dependency_failed): its reason is set while it
-- is still queued, running or waiting, and it ends once its last task did (outcomes.end_step). An
-- active job has no reason otherwise, so this is the mark that a restart finds (cascades_pending).
UPDATE jobs SET reason = :reason
WHERE id = :job_id AND state IN ('queued', 'running', 'waiting') AND reason IS NULL
RETURNING id;

-- name: cancel_queued_batch --
-- Cancel: up to :n tasks not yet running (-1: all) end at once, for :reason (cancelled, or
-- dependency_failed as their job): one bounded write of a big array's cancel.
UPDATE tasks SET state = 'cancelled', reason = :reason, finished_at = :now
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
             WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state IN ('queued', 'assigned')
             LIMIT :n)
RETURNING id, "index", worker_id;

-- name: cancel_running_tasks --
-- Cancel: running tasks are stopped through their worker's next heartbeat.
UPDATE tasks SET cancel_requested = 1
WHERE job_id = :job_id AND state = 'running'
RETURNING id, worker_id;

-- name: requeued_attempts --
-- How many attempts of a job (of one array element with :index) a requeue made (`attempt_requeued` events):
-- they are not counted against its retries (retries_left). Requeues are rare: their events are few.
SELECT count(*) AS n FROM events INDEXED BY events_kind_at
WHERE kind = 'attempt_requeued' AND job_id = :job_id AND (:index IS NULL OR json_extract(data, '$.index') = :index);
