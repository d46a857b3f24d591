-- The queries of scheduler/views.py: how a job reads (the Job, a page of jobs, log pages, events,
-- endpoints, why it waits).

-- name: job_dependencies_of --
-- What a job runs after, with where each of those stands now.
SELECT d.after_job_id AS job, d.condition, a.state, a.name
FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
WHERE d.job_id = :job_id ORDER BY d.after_job_id;

-- name: job_reservation --
-- The room a waiting job holds from a time to come (EASY backfill: reservations): its workers, by name.
SELECT w.name, r.start_at FROM reservations r JOIN workers w ON w.id = r.worker_id
WHERE r.job_id = :job_id ORDER BY w.name;

-- name: array_counts --
-- An array's elements by the state of their latest task ('held' for queued but not released),
-- when the first of them started, and how many tasks of each state a retry replaced: every task
-- counted by state, less those replaced (an element's attempt k + 1 replaces its attempt k).
-- One pass over the array's tasks grouped by state, not by index (which sorts them all): 2x
-- faster at 100,000.
SELECT state, sum(n) AS n, min(started_at) AS started_at, sum(replaced) AS replaced FROM (
    SELECT CASE WHEN state = 'queued' AND held = 1 THEN 'held' ELSE state END AS state, count(*) AS n,
           min(started_at) AS started_at, 0 AS replaced
    FROM tasks WHERE job_id = :job_id GROUP BY 1
    UNION ALL
    SELECT p.state, -count(*), NULL, count(*) FROM tasks r
    JOIN tasks p ON p.job_id = r.job_id AND p.attempt = r.attempt - 1 AND p."index" = r."index"
    WHERE r.job_id = :job_id AND r.attempt >= 2 GROUP BY 1)
GROUP BY state;

-- name: array_element_released --
-- Has a running array an element released to the queue but not placed (its waiting reason is
-- then told)? Two seeks, not a walk of what is held: release goes lowest index first and a
-- retry is a new task, released, so the queued tasks by id are the released ones, then the
-- held ones, then the retries; one released is queued iff the first or the last is.
SELECT 1 AS found FROM (
    SELECT * FROM (SELECT held FROM tasks INDEXED BY tasks_job_active
                   WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'queued'
                   ORDER BY id LIMIT 1)
    UNION ALL
    SELECT * FROM (SELECT held FROM tasks INDEXED BY tasks_job_active
                   WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'queued'
                   ORDER BY id DESC LIMIT 1))
WHERE held = 0 LIMIT 1;

-- name: array_failed_indices --
-- The indices of an array's elements whose latest task (one no retry replaced) ended without
-- success, at most :limit (:limit 0 reads nothing).
SELECT t."index", t.state, t.exit_code, t.reason FROM tasks t
WHERE t.job_id = :job_id AND t.state IN ('failed', 'cancelled', 'lost')
  AND NOT EXISTS (SELECT 1 FROM tasks n WHERE n.job_id = t.job_id AND n.attempt = t.attempt + 1
                                          AND n."index" = t."index")
ORDER BY t."index" LIMIT :limit;

-- name: array_tasks_shown --
-- The tasks of an array a job view lists: the active ones, at most :limit, then the latest that
-- did not succeed, at most :ended_limit (0 when array_counts counts none: they are not looked for).
SELECT * FROM (
    SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
           t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
           t.revision, t.gpu_indices, t.gpu_share, w.name AS worker_name
    FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
    -- (the redundant IN term lets SQLite use the partial index tasks_job_active, not all the array's tasks,
    -- written second, so that the index is searched for the two states, not walked through every queued task)
    WHERE t.job_id = :job_id AND t.state IN ('assigned', 'running') AND t.state IN ('queued', 'assigned', 'running')
    ORDER BY t."index" LIMIT :limit)
UNION ALL
SELECT * FROM (
    SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
           t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
           t.revision, t.gpu_indices, t.gpu_share, w.name AS worker_name
    FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
    WHERE :ended_limit > 0 AND t.job_id = :job_id AND t.state IN ('failed', 'cancelled', 'lost')
    ORDER BY t."index", t.attempt DESC LIMIT :ended_limit);

-- name: job_tasks --
-- The tasks of a job, every attempt, newest attempt first.
SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
       t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
       t.revision, t.gpu_indices, t.gpu_share, w.name AS worker_name
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id ORDER BY t.attempt DESC, t."index";

-- name: list_jobs --
-- Jobs newest first, optionally of one state, named like the glob :name, created at or after :since,
-- before a job id; of one owner (:owner_id) or project (:project_id); and only those :viewer_id may
-- see (its own and its projects'; NULL: an admin).
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running,
       revision
FROM jobs
WHERE (:state IS NULL OR state = :state) AND (:before IS NULL OR id < :before)
  AND (:name IS NULL OR coalesce(name, '') GLOB :name) AND (:since IS NULL OR created_at >= :since)
  AND (:owner_id IS NULL OR user_id = :owner_id) AND (:project_id IS NULL OR project_id = :project_id)
  AND (:viewer_id IS NULL OR user_id = :viewer_id
       OR project_id IN (SELECT m.project_id FROM memberships m WHERE m.user_id = :viewer_id))
ORDER BY id DESC LIMIT :limit;

-- name: list_jobs_of_owner --
-- list_jobs for one owner (:owner_id set, the default of `job list`): walks that user's jobs alone,
-- newest first, however many other jobs there are.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running,
       revision
FROM jobs INDEXED BY jobs_user_id
WHERE user_id = :owner_id AND (:state IS NULL OR state = :state) AND (:before IS NULL OR id < :before)
  AND (:name IS NULL OR coalesce(name, '') GLOB :name) AND (:since IS NULL OR created_at >= :since)
  AND (:project_id IS NULL OR project_id = :project_id)
  AND (:viewer_id IS NULL OR user_id = :viewer_id
       OR project_id IN (SELECT m.project_id FROM memberships m WHERE m.user_id = :viewer_id))
ORDER BY id DESC LIMIT :limit;

-- name: job_logs --
-- Log lines of a job after a sequence number, with the index (element, replica, rank) of their task.
SELECT l.seq, l.task_id, t."index", l.stream, l.at, l.text FROM logs l JOIN tasks t ON t.id = l.task_id
WHERE l.job_id = :job_id AND l.seq > :after ORDER BY l.seq LIMIT :limit;

-- name: element_logs --
-- Log lines of one element of an array (or one replica / rank) after a sequence number.
SELECT seq, task_id, :index AS "index", stream, at, text FROM logs
WHERE task_id IN (SELECT id FROM tasks WHERE job_id = :job_id AND "index" = :index) AND seq > :after
ORDER BY seq LIMIT :limit;

-- name: job_events --
-- The event timeline of a job after the sequence number :after, a page of at most :limit (-1: all).
SELECT seq, at, kind, task_id, worker_id, data, actor FROM events
WHERE job_id = :job_id AND seq > :after ORDER BY seq LIMIT :limit;

-- name: job_endpoints --
-- Replica endpoints of the job's current attempt.
SELECT t."index", t.endpoint, t.state FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.attempt = j.attempt ORDER BY t."index";

-- name: task_restart_message --
-- A service replica's last restart line ("restart 4: exited with code 1; next run in 8 s",
-- a system line of its agent), looked for among its last 200 lines only: the
-- (task_id, n) index walks back from the newest, so a chatty replica costs no more.
SELECT text FROM logs
WHERE task_id = :task_id AND stream = 'system' AND text GLOB 'restart [0-9]*'
  AND n > (SELECT max(n) FROM logs WHERE task_id = :task_id) - 200
ORDER BY n DESC LIMIT 1;

-- name: job_quota_reason --
-- What of acquire's admission holds a queued job back (acquire_task, next_gang_job), as facts
-- that scheduler/waiting.py puts in words. `why`: 'quota' (its project's GPUs in use and its
-- task, or a gang's ranks, pass `nominal + borrow`: `in_use` of the nominal quota and
-- `borrowed` beyond it), 'borrowing' (it would borrow while another project waits within its
-- nominal quota), 'user_limit' (its user is at the running-jobs limit: user_running_jobs; a
-- running job's queued replica adds no job, an array's element does); NULL when none does.
WITH j AS (SELECT * FROM jobs WHERE id = CAST(:job_id AS INTEGER) AND state IN ('queued', 'running')),
q AS (SELECT q.* FROM project_quota_use q JOIN j ON q.project_id = j.project_id),
need AS (SELECT j.gpus * CASE WHEN j.gang = 1 THEN j.width ELSE 1 END AS gpus FROM j)
SELECT CASE
    WHEN q.nominal IS NOT NULL AND j.gpus > 0 AND q.gpus_in_use + need.gpus > q.nominal + q.borrow THEN 'quota'
    WHEN q.nominal IS NOT NULL AND j.gpus > 0 AND q.gpus_in_use + need.gpus > q.nominal
         AND EXISTS (SELECT 1 FROM project_quota_use o
                     JOIN queue_groups g ON g.project_id = o.project_id
                     JOIN shapes s ON s.id = g.shape_id
                     WHERE o.project_id <> q.project_id AND o.nominal IS NOT NULL AND s.gpus > 0
                       AND o.gpus_in_use + s.gpus <= o.nominal) THEN 'borrowing'
    WHEN (j.state = 'queued' OR j.array_size IS NOT NULL) AND u.at_limit THEN 'user_limit'
END AS why,
       q.name AS project, q.nominal, min(q.gpus_in_use, q.nominal) AS in_use, q.borrowed,
       u.name AS user, u.max_running_jobs
FROM j, q, need
LEFT JOIN user_running_jobs u ON u.user_id = j.user_id;

-- name: job_preemptions --
-- A job's tasks preempted (or being preempted), oldest first: `job status` shows them; the latest :limit.
SELECT task_id, worker_id, for_task_id, for_job_id, reason, asked_at, done_at FROM (
    SELECT pe.id, pe.task_id, pe.worker_id, pe.for_task_id, pe.for_job_id, pe.reason, pe.asked_at, pe.done_at
    FROM preemptions pe
    WHERE pe.task_id IN (SELECT id FROM tasks WHERE job_id = :job_id)
    ORDER BY pe.id DESC LIMIT :limit)
ORDER BY id;
