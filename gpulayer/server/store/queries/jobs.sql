-- The queries of scheduler/jobs.py: submit, arrays, dependencies, cancel of an element (how a job reads: views.sql).

-- name: insert_job --
-- A submitted job with its placement requirements copied out of the spec; :state is
-- 'queued', or 'waiting' while a dependency has not ended.
INSERT INTO jobs (name, state, spec, kind, priority, labels, secrets, accelerator, gpus, cpus, memory_mb,
                  width, gang, attempt, max_attempts, retry_on, created_at, array_size, max_running,
                  user_id, project_id, preemptible, hold, begin_at, gpu_fraction, gpu_memory_mb, gpu_link)
VALUES (:name, :state, :spec, :kind, :priority, :labels, :secrets, :accelerator, :gpus, :cpus, :memory_mb,
        :width, :gang, 1, :max_attempts, :retry_on, :now, :array_size, :max_running, :user_id, :project_id,
        :preemptible, :hold, :begin_at, :gpu_fraction, :gpu_memory_mb, :gpu_link)
RETURNING id;

-- name: insert_tasks --
-- A submitted job's tasks in one statement, one per index of the JSON list :indices (its
-- replicas or ranks, or an array's elements, from the :offset-th); the first :released are queued,
-- the rest held (a waiting job releases none; an array with a %N cap releases N).
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at, held)
SELECT :job_id, e.value, 1, 'queued', :priority, :now, e.key + :offset >= :released
FROM json_each(:indices) e;

-- name: insert_dependency --
-- Job :job_id runs after job :after_job_id ends as :condition says.
INSERT INTO job_dependencies (job_id, after_job_id, condition) VALUES (:job_id, :after_job_id, :condition);

-- name: element_tasks --
-- The tasks of one element of an array (or one replica / rank), newest attempt first.
SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
       t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
       t.revision, t.gpu_indices, t.gpu_share, w.name AS worker_name
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id AND t."index" = :index ORDER BY t.attempt DESC;

-- name: cancel_element --
-- Cancel one element of an array: its task ends now when queued (held or not) or only
-- assigned, or is stopped through its worker's heartbeat when running.
UPDATE tasks
SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
    reason = CASE WHEN state = 'running' THEN reason ELSE 'cancelled' END,
    finished_at = CASE WHEN state = 'running' THEN finished_at ELSE :now END,
    cancel_requested = CASE WHEN state = 'running' THEN 1 ELSE cancel_requested END
WHERE job_id = :job_id AND "index" = :index AND state IN ('queued', 'assigned', 'running')
RETURNING id, state, held, attempt, worker_id;

-- name: user_queued_elements --
-- A user's tasks not yet ended (queued, held or not, assigned, running) of jobs not being cancelled,
-- counted up to :limit (the cap on them, `--max-queued-elements`: the walk stops there).
SELECT count(*) AS n FROM (
    SELECT 1 FROM jobs j INDEXED BY jobs_user_state
    JOIN tasks t INDEXED BY tasks_job_active ON t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
    WHERE j.user_id = :user_id AND j.state IN ('queued', 'running', 'waiting') AND j.reason IS NULL
    LIMIT :limit);

-- name: get_job --
-- One job.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running,
       hold, begin_at, revision
FROM jobs WHERE id = :job_id;

-- name: touch_artifact --
-- A job names this artifact: it counts as used now, and named (no upload quota counts it). No row back:
-- it is not stored.
UPDATE artifacts SET last_used_at = :now, named_at = coalesce(named_at, :now) WHERE digest = :digest RETURNING digest;
