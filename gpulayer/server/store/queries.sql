-- Every query of the control plane, by name. Parameters are named (:now is
-- always a parameter, never the wall clock, so tests pin time).
-- Active task states are 'assigned' and 'running' throughout.
-- A parameter that joins a view (`f.worker_id = CAST(:worker_id AS INTEGER)`) is
-- CAST: SQLite 3.54 prepares a join whose key is a bare parameter again on every
-- run (one job's fit on one worker: ~170 us instead of ~13 us); an expression is not.

-- name: insert_event --
-- Append one event; written in the transaction of the change it records.
INSERT INTO events (at, kind, job_id, task_id, worker_id, data, actor)
VALUES (:now, :kind, :job_id, :task_id, :worker_id, :data, :actor);

-- name: insert_job --
-- A submitted job with its placement requirements copied out of the spec; :state is
-- 'queued', or 'waiting' while a dependency has not ended.
INSERT INTO jobs (name, state, spec, kind, priority, labels, secrets, accelerator, gpus, cpus, memory_mb,
                  width, gang, attempt, max_attempts, retry_on, created_at, array_size, max_running,
                  user_id, project_id, preemptible)
VALUES (:name, :state, :spec, :kind, :priority, :labels, :secrets, :accelerator, :gpus, :cpus, :memory_mb,
        :width, :gang, 1, :max_attempts, :retry_on, :now, :array_size, :max_running, :user_id, :project_id,
        :preemptible)
RETURNING id;

-- name: insert_tasks --
-- A submitted job's tasks in one statement, one per index of the JSON list :indices (its
-- replicas or ranks, or an array's elements, from the :offset-th); the first :released are queued,
-- the rest held (a waiting job releases none; an array with a %N cap releases N).
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at, held)
SELECT :job_id, e.value, 1, 'queued', :priority, :now, e.key + :offset >= :released
FROM json_each(:indices) e;

-- name: array_element_made --
-- Has the array's element :index its first task yet (a big array's are made BATCH a write, in order)?
SELECT 1 AS found FROM tasks INDEXED BY tasks_job WHERE job_id = :job_id AND attempt = 1 AND "index" = :index;

-- name: release_held_tasks --
-- Release up to :n held tasks of a job (-1: all), lowest index first: they join task_queue, aging
-- from now (queued_at).
UPDATE tasks SET held = 0, queued_at = :now
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_held
             WHERE job_id = :job_id AND state = 'queued' AND held = 1 ORDER BY "index" LIMIT :n)
RETURNING id;

-- name: insert_dependency --
-- Job :job_id runs after job :after_job_id ends as :condition says.
INSERT INTO job_dependencies (job_id, after_job_id, condition) VALUES (:job_id, :after_job_id, :condition);

-- name: waiting_dependents --
-- The waiting jobs that wait on a job that just ended, with their condition on it: up to :n of
-- them after job :cursor, not those being cancelled already (reason set). (CROSS JOIN keeps
-- SQLite from walking every waiting job instead: the cost is this job's dependents only.)
SELECT d.job_id, d.condition FROM job_dependencies d CROSS JOIN jobs j ON j.id = d.job_id
WHERE d.after_job_id = :after_job_id AND d.job_id > :cursor AND j.state = 'waiting' AND j.reason IS NULL
ORDER BY d.job_id LIMIT :n;

-- name: release_job --
-- A waiting job whose dependencies have all ended (none ended against its condition, or
-- it would be cancelled) is queued.
UPDATE jobs SET state = 'queued'
WHERE id = :job_id AND state = 'waiting' AND reason IS NULL
  AND NOT EXISTS (SELECT 1 FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
                  WHERE d.job_id = :job_id AND a.finished_at IS NULL)
RETURNING id, max_running;

-- name: cascades_pending --
-- At start (a read): what a cascade left undone when the control plane stopped between two of its
-- writes (scheduler/cascades.py). `end`: a job being cancelled (an active job with a reason, set by
-- mark_job_ending). `settle`: a job that ended while jobs that wait on it are still waiting (their
-- other dependencies may simply not have ended: settling them again changes nothing). `release`: a
-- released job with held tasks that its %N cap (or none) lets go, `arg` how many (NULL: all).
-- `insert`: an array whose elements are not all made yet, `arg` how many are.
SELECT 'end' AS kind, id AS job_id, 0 AS arg FROM jobs
WHERE state IN ('queued', 'running', 'waiting') AND reason IS NOT NULL
UNION
SELECT 'settle', d.after_job_id, 0 FROM jobs j
JOIN job_dependencies d ON d.job_id = j.id JOIN jobs a ON a.id = d.after_job_id
WHERE j.state = 'waiting' AND j.reason IS NULL AND a.finished_at IS NOT NULL
UNION
SELECT 'insert', id, arg FROM (
    SELECT j.id, (SELECT count(*) FROM tasks t INDEXED BY tasks_job WHERE t.job_id = j.id AND t.attempt = 1) AS arg,
           j.array_size FROM jobs j
    WHERE j.state IN ('queued', 'running', 'waiting') AND j.reason IS NULL AND j.array_size IS NOT NULL)
WHERE arg < array_size
UNION
SELECT 'release', id, arg FROM (
    SELECT j.id, CASE WHEN j.max_running IS NOT NULL THEN j.max_running - (
               SELECT count(*) FROM tasks t INDEXED BY tasks_job_active
               WHERE t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running') AND t.held = 0) END AS arg
    FROM jobs j
    WHERE j.state IN ('queued', 'running') AND j.reason IS NULL
      AND EXISTS (SELECT 1 FROM tasks h INDEXED BY tasks_held WHERE h.job_id = j.id AND h.state = 'queued' AND h.held = 1))
WHERE arg IS NULL OR arg > 0
ORDER BY 2;

-- name: job_dependencies_of --
-- What a job runs after, with where each of those stands now.
SELECT d.after_job_id AS job, d.condition, a.state, a.name
FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
WHERE d.job_id = :job_id ORDER BY d.after_job_id;

-- name: job_has_active_task --
-- Has the job a task still to end (queued, held or not, assigned or running)?
SELECT 1 AS found FROM tasks INDEXED BY tasks_job_active
WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') LIMIT 1;

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
           w.name AS worker_name
    FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
    -- (the redundant IN term lets SQLite use the partial index tasks_job_active, not all the array's tasks,
    -- written second, so that the index is searched for the two states, not walked through every queued task)
    WHERE t.job_id = :job_id AND t.state IN ('assigned', 'running') AND t.state IN ('queued', 'assigned', 'running')
    ORDER BY t."index" LIMIT :limit)
UNION ALL
SELECT * FROM (
    SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
           t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
           w.name AS worker_name
    FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
    WHERE :ended_limit > 0 AND t.job_id = :job_id AND t.state IN ('failed', 'cancelled', 'lost')
    ORDER BY t."index", t.attempt DESC LIMIT :ended_limit);

-- name: element_tasks --
-- The tasks of one element of an array (or one replica / rank), newest attempt first.
SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
       t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
       w.name AS worker_name
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id AND t."index" = :index ORDER BY t.attempt DESC;

-- name: task_element --
-- The element index and attempt of a task (an array element's retry counts its own attempts).
SELECT "index", attempt FROM tasks WHERE id = :task_id;

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

-- name: insert_task --
-- One queued task of a job's attempt (a replica or a rank).
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at)
VALUES (:job_id, :index, :attempt, 'queued', :priority, :now)
RETURNING id;

-- name: assigned_task_for_worker --
-- acquire is idempotent until start: the assigned tasks not started yet (oldest first, at
-- most :limit) are handed out again.
-- (The redundant IN term lets SQLite use the partial index tasks_worker_active;
-- without it this scans every task the worker ever ran: 7 ms at 100k tasks.)
SELECT id FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND state = 'assigned'
  AND cancel_requested = 0
ORDER BY id LIMIT :limit;

-- name: worker_free --
-- What an online worker has free now (worker_load), with what acquisition hands on.
SELECT l.worker_id AS id, l.gpus, l.free_slots, w.advertise_address
FROM worker_load l JOIN workers w ON w.id = l.worker_id
WHERE l.worker_id = CAST(:worker_id AS INTEGER) AND l.state = 'online';

-- name: acquire_task --
-- Atomic acquisition: the best queued task of a job that the worker fits now
-- (job_worker_fit.fits_now: labels, accelerator, size, secrets, free room, no other replica
-- of the job on it) and that its project's GPU quota and its user's running-jobs limit admit.
-- Best: priority, then fair share (the project's decayed usage over its share, then the
-- user's usage within the project), then first come. Read by group, not by task: the fit of
-- each shape with queued tasks (shape_worker_fit.fits_now), then its groups of queued work
-- (queue_groups: shape, project, user), judged once each against the quota (`nominal +
-- borrow`, and borrowed GPUs only while no other project with unused nominal quota waits
-- for this worker), then each admitted group's best task of a job the worker holds none of
-- (job_worker_fit.holds_task; an array's elements may share a worker), then the best of
-- those; so queued tasks the worker cannot take cost nothing. The user's limit is judged on
-- that best task (a task of a job already running adds no job, except an array's: each
-- active element counts as a job, as Slurm's MaxJobs counts array tasks). Held tasks (a waiting
-- job's, an array's past its %N cap) are not in task_queue: the cap holds because a capped
-- array has at most N tasks released at once. Room held on the worker for a waiting gang
-- (gang_reservations, while its preemption victims stop) is not taken: only what is beyond it.
-- Priority is the task's with its age boost (task_queue.aged: upkeep's age_queued_tasks), read in
-- the order of task_queue_shape, so aging costs the claim nothing.
-- Gang (multi-node) jobs are placed by gang_workers / assign_task instead. job_quota_reason
-- words what holds a job back here.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id = (
    WITH cand AS MATERIALIZED (
        SELECT g.shape_id, g.project_id, g.user_id, s.gpus, p.gpu_quota AS nominal, p.gpu_borrow AS borrow,
               coalesce(p.weight, nullif(p.gpu_quota, 0), 1) AS share, u.max_running_jobs,
               CASE WHEN p.gpu_quota IS NULL THEN 0 ELSE (  -- the project's GPUs in use (project_load)
                   SELECT coalesce(sum(j.gpus), 0) FROM jobs j
                   -- (the redundant IN term seeks tasks_job_active by state, not a running array's every task)
                   JOIN tasks t ON t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
                                   AND t.state IN ('assigned', 'running')
                   WHERE j.project_id = g.project_id AND j.state = 'running') END AS in_use
        FROM shapes s INDEXED BY shapes_queued
        JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
        CROSS JOIN queue_groups g ON g.shape_id = s.id
        JOIN projects p ON p.id = g.project_id
        LEFT JOIN users u ON u.id = g.user_id
        WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now
          -- room held on this worker for a waiting gang (gang_reservations): only what is beyond it
          AND (NOT EXISTS (SELECT 1 FROM gang_reservations r
                           WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now)
               OR (SELECT l.free_slots - count(*) >= 1 AND l.free_gpus - total(r.gpus) >= s.gpus
                          AND l.free_cpus - total(r.cpus) >= s.cpus
                          AND l.free_memory_mb - total(r.memory_mb) >= s.memory_mb
                   FROM gang_reservations r, worker_load l
                   WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now
                     AND l.worker_id = CAST(:worker_id AS INTEGER)))
    ),
    admitted AS (
        SELECT c.* FROM cand c
        WHERE c.nominal IS NULL OR c.gpus = 0
           OR c.in_use + c.gpus <= c.nominal
           OR (c.in_use + c.gpus <= c.nominal + c.borrow
               AND NOT EXISTS (SELECT 1 FROM cand o
                               WHERE o.project_id <> c.project_id AND o.gpus > 0 AND o.nominal IS NOT NULL
                                 AND o.in_use + o.gpus <= o.nominal))
    )
    SELECT head.task_id
    FROM admitted a
    JOIN task_queue head ON head.task_id = (
        SELECT h.task_id FROM task_queue h
        WHERE h.shape_id = a.shape_id AND h.project_id = a.project_id AND h.user_id = a.user_id
          AND (NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's (an array's many)
                           WHERE o.worker_id = CAST(:worker_id AS INTEGER) AND +o.job_id = h.job_id
                             AND o.state IN ('assigned', 'running'))
               OR (SELECT x.array_size FROM jobs x WHERE x.id = h.job_id) IS NOT NULL)
        ORDER BY h.priority + h.aged DESC, h.task_id
        LIMIT 1)
    WHERE a.max_running_jobs IS NULL
       OR (SELECT r.state = 'running' AND r.array_size IS NULL FROM jobs r WHERE r.id = head.job_id)
       OR (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
           SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                          AND t.state IN ('assigned', 'running')) END)
        FROM jobs r WHERE r.user_id = a.user_id AND r.state = 'running') < a.max_running_jobs
    ORDER BY head.priority + head.aged DESC,
             (SELECT coalesce(sum(fs.usage * pow(0.5, (:now - fs.updated_at) / st.fairshare_half_life_s)
                                  + fs.running), 0)
              FROM fairshare fs, scheduler_settings st WHERE fs.project_id = a.project_id) / a.share,
             (SELECT fs.usage * pow(0.5, (:now - fs.updated_at) / st.fairshare_half_life_s) + fs.running
              FROM fairshare fs, scheduler_settings st WHERE fs.project_id = a.project_id AND fs.user_id = a.user_id),
             head.task_id
    LIMIT 1
)
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus,
          (SELECT array_size FROM jobs WHERE jobs.id = tasks.job_id) AS array_size;

-- name: gpus_in_use --
-- Device indices held by the worker's active tasks, and those out of service (unhealthy).
SELECT g.value AS i FROM tasks u, json_each(u.gpu_indices) g
WHERE u.worker_id = :worker_id AND u.state IN ('assigned', 'running')
UNION ALL
SELECT "index" FROM worker_gpus WHERE worker_id = :worker_id AND healthy = 0;

-- name: worker_mig_indices --
-- A worker's MIG instances (a task of more than one GPU is given none: shape_worker_fit).
SELECT "index" AS i FROM worker_gpus WHERE worker_id = :worker_id AND uuid GLOB 'MIG-*';

-- name: task_model_indices --
-- For a task whose job asks for a `gpu_model` that the worker meets by its GPUs (not by a
-- worker label; shape_worker_fit), the worker's indices of that model; no row otherwise.
SELECT m.key AS i FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN workers w ON w.id = :worker_id,
     json_each(w.gpu_models) m
WHERE t.id = :task_id AND json_extract(j.labels, '$.gpu_model') IS NOT NULL
  AND json_extract(j.labels, '$.gpu_model') IS NOT json_extract(w.labels, '$.gpu_model')
  AND m.value = json_extract(j.labels, '$.gpu_model');

-- name: set_gpu_indices --
-- Reserve device indices for an assigned task.
UPDATE tasks SET gpu_indices = :gpu_indices WHERE id = :task_id AND state = 'assigned' RETURNING id;

-- name: any_queued_gang --
-- Is any multi-node job waiting? (Gang placement is skipped when none is.)
SELECT 1 AS found FROM jobs INDEXED BY jobs_queued_gangs WHERE state = 'queued' AND gang = 1 LIMIT 1;

-- name: next_gang_job --
-- The best queued multi-node jobs that the polling worker fits now (one rank of)
-- (several, so that a gang too wide for the fleet does not block the ones behind it), whose
-- project's GPU quota holds every rank (`nominal + borrow`; borrowed GPUs only while no other
-- project waits within its nominal quota, judged over all queued work, not this worker's) and
-- whose user is below the running-jobs limit; best as in acquire_task (priority with its age boost:
-- its queued ranks' task_queue.aged; the project's fair share, first come).
SELECT j.id, j.attempt, j.width
FROM jobs j INDEXED BY jobs_queued_gangs
JOIN job_worker_fit f ON f.job_id = j.id AND f.worker_id = CAST(:worker_id AS INTEGER)
JOIN projects p ON p.id = j.project_id
LEFT JOIN users u ON u.id = j.user_id
WHERE j.state = 'queued' AND j.gang = 1 AND f.fits_now
  AND (p.gpu_quota IS NULL OR j.gpus = 0
       OR (SELECT q.gpus_in_use FROM project_quota_use q WHERE q.project_id = j.project_id) + j.gpus * j.width
          <= p.gpu_quota
       OR ((SELECT q.gpus_in_use FROM project_quota_use q WHERE q.project_id = j.project_id) + j.gpus * j.width
           <= p.gpu_quota + p.gpu_borrow
           AND NOT EXISTS (SELECT 1 FROM queue_groups g
                           JOIN shapes s ON s.id = g.shape_id AND s.gpus > 0
                           JOIN project_quota_use o ON o.project_id = g.project_id
                           WHERE g.project_id <> j.project_id AND o.nominal IS NOT NULL
                             AND o.gpus_in_use + s.gpus <= o.nominal)))
  AND (u.max_running_jobs IS NULL
       OR (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
           SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                          AND t.state IN ('assigned', 'running')) END)
        FROM jobs r WHERE r.user_id = j.user_id AND r.state = 'running') < u.max_running_jobs)
ORDER BY j.priority + (SELECT coalesce(max(q.aged), 0) FROM tasks t JOIN task_queue q ON q.task_id = t.id
                       WHERE t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
                         AND t.state = 'queued') DESC,
         (SELECT coalesce(sum(fs.usage * pow(0.5, (:now - fs.updated_at) / st.fairshare_half_life_s)
                              + fs.running), 0)
          FROM fairshare fs, scheduler_settings st WHERE fs.project_id = j.project_id)
         / coalesce(p.weight, nullif(p.gpu_quota, 0), 1),
         j.id
LIMIT :limit;

-- name: gang_workers --
-- Distinct workers that fit one rank of :job_id now and hold no room for another waiting gang
-- (gang_reservations: another gang skips such a worker whole, while single tasks may take
-- what is beyond the room held); the polling worker first, then those holding room for this
-- job, then those left with the fewest free GPUs.
SELECT f.worker_id
FROM job_worker_fit f
WHERE f.job_id = CAST(:job_id AS INTEGER) AND f.fits_now
  AND NOT EXISTS (SELECT 1 FROM gang_reservations r
                  WHERE r.worker_id = f.worker_id AND r.job_id <> f.job_id AND r.expires_at > :now)
ORDER BY f.worker_id = :worker_id DESC,
         EXISTS (SELECT 1 FROM gang_reservations r WHERE r.worker_id = f.worker_id AND r.job_id = f.job_id) DESC,
         f.spare_gpus, f.worker_id
LIMIT :width;

-- name: assign_task --
-- Give one queued task (a gang rank) to a given worker.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = (SELECT advertise_address FROM workers WHERE id = :worker_id)
WHERE id = :task_id AND state = 'queued'
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus;

-- name: queued_tasks_of_attempt --
-- The ranks of one gang attempt still waiting, in rank order.
SELECT id, "index" FROM tasks
WHERE job_id = :job_id AND attempt = :attempt AND state = 'queued'
ORDER BY "index";

-- name: mark_job_running --
-- A job leaves the queue when its first task is assigned.
UPDATE jobs SET state = 'running' WHERE id = :job_id AND state = 'queued';

-- name: assignment --
-- Everything a worker needs to run a task.
SELECT t.id AS task_id, t.job_id, t.attempt, t."index", t.gpu_indices, j.spec, j.width, j.gang, j.array_size
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.id = :task_id;

-- name: start_task --
-- The worker started the task's process: ownership-checked.
UPDATE tasks SET state = 'running', started_at = :now, pid = :pid
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

-- name: renew_worker --
-- A heartbeat: the worker's lease moves on; an offline worker comes back.
UPDATE workers
SET last_seen_at = :now, lease_expires_at = :lease_expires_at,
    state = CASE WHEN state = 'offline' THEN 'online' ELSE state END
WHERE id = :worker_id
RETURNING state, gone_reason;

-- name: renew_task_leases --
-- A heartbeat renews the lease of every task the worker holds.
UPDATE tasks SET lease_expires_at = :lease_expires_at
WHERE worker_id = :worker_id AND state IN ('assigned', 'running');

-- name: report_task --
-- Store a replica's endpoint and restart count as the worker reports them; a row back means a change.
UPDATE tasks SET endpoint = :endpoint, restarts = :restarts
WHERE id = :task_id AND worker_id = :worker_id AND state = 'running'
  AND (endpoint IS NOT :endpoint OR restarts <> :restarts)
RETURNING id, job_id, endpoint, restarts;

-- name: worker_active_tasks --
-- What the control plane thinks this worker holds, and what it wants cancelled.
SELECT id, cancel_requested FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running');

-- name: expire_task_leases --
-- Tasks whose lease passed are lost, and so are those of a worker whose own
-- lease passed: a task acquired after the worker's last heartbeat has a later
-- lease, which must not outlive the worker (it goes offline just after).
UPDATE tasks SET state = 'lost', reason = 'worker_lost', finished_at = :now, endpoint = NULL
WHERE state IN ('assigned', 'running')
  AND (lease_expires_at < :now
       OR worker_id IN (SELECT id FROM workers WHERE state = 'online' AND lease_expires_at < :now))
RETURNING id, job_id, attempt, worker_id;

-- name: expire_workers --
-- Workers whose lease passed go offline (they keep their session token).
UPDATE workers SET state = 'offline'
WHERE state = 'online' AND lease_expires_at < :now
RETURNING id, name;

-- name: stale_gang_tasks --
-- Gang ranks assigned but not started within the start timeout.
SELECT DISTINCT t.job_id, t.attempt
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'assigned' AND j.gang = 1 AND t.assigned_at < :deadline;

-- name: release_attempt --
-- Put every active rank of a gang attempt back in the queue, holding nothing.
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('assigned', 'running')
RETURNING id, worker_id;

-- name: clear_rendezvous --
-- Forget the arrivals of a released gang attempt.
DELETE FROM rendezvous WHERE job_id = :job_id AND attempt = :attempt;

-- name: job_for_update --
-- The job row that task-ending decisions read.
SELECT id, state, kind, width, gang, attempt, max_attempts, retry_on, priority, array_size, max_running, reason
FROM jobs WHERE id = :job_id;

-- name: attempt_tasks --
-- Every task of one attempt of a job.
SELECT id, "index", state, exit_code, outcome, reason, worker_id, cancel_requested
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

-- name: user_queued_elements --
-- A user's tasks not yet ended (queued, held or not, assigned, running) of jobs not being cancelled,
-- counted up to :limit (the cap on them, `--max-queued-elements`: the walk stops there).
SELECT count(*) AS n FROM (
    SELECT 1 FROM jobs j INDEXED BY jobs_user_state
    JOIN tasks t INDEXED BY tasks_job_active ON t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
    WHERE j.user_id = :user_id AND j.state IN ('queued', 'running', 'waiting') AND j.reason IS NULL
    LIMIT :limit);

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

-- name: register_worker --
-- A new worker row with its hashed session token.
INSERT INTO workers (name, state, labels, token_labels, cpus, gpus, memory_mb, gpu_models, slots,
                     advertise_address, version, protocol, session_hash, token_jti,
                     registered_at, last_seen_at, lease_expires_at)
VALUES (:name, 'online', :labels, :token_labels, :cpus, :gpus, :memory_mb, :gpu_models, :slots,
        :advertise_address, :version, :protocol, :session_hash, :token_jti,
        :now, :now, :lease_expires_at)
RETURNING id;

-- name: online_worker_named --
-- An online worker with this name, if any (a new one with the same name is warned).
SELECT id FROM workers WHERE name = :name AND state = 'online' ORDER BY id LIMIT 1;

-- name: mark_needs_upgrade --
-- A worker refused for another protocol is listed until it registers again.
INSERT INTO workers (name, state, labels, version, protocol, token_jti, registered_at, last_seen_at)
VALUES (:name, 'needs_upgrade', '{}', :version, :protocol, :token_jti, :now, :now);

-- name: clear_needs_upgrade --
-- A worker of that name registered with the right protocol (or the server restarted).
UPDATE workers SET state = 'gone', gone_reason = :reason
WHERE state = 'needs_upgrade' AND (:name IS NULL OR name = :name);

-- name: worker_gone --
-- Deregistered or revoked: the worker never comes back.
UPDATE workers SET state = 'gone', gone_reason = :reason, lease_expires_at = NULL
WHERE id = :worker_id AND state <> 'gone'
RETURNING id;

-- name: worker_tasks_lost --
-- What a departing worker held ends as lost, for the retry policy to judge.
UPDATE tasks SET state = 'lost', reason = :reason, finished_at = :now, endpoint = NULL
WHERE worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt;

-- name: workers_of_token --
-- The live workers that registered with a join token.
SELECT id FROM workers WHERE token_jti = :jti AND state IN ('online', 'offline');

-- name: worker_by_session --
-- Authenticate a worker session token by its hash.
SELECT id, name, state, gone_reason, session_hash, labels, token_labels, advertise_address, token_jti
FROM workers WHERE session_hash = :session_hash;

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

-- name: get_job --
-- One job.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running
FROM jobs WHERE id = :job_id;

-- name: job_tasks --
-- The tasks of a job, every attempt, newest attempt first.
SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
       t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
       w.name AS worker_name
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id ORDER BY t.attempt DESC, t."index";

-- name: list_jobs --
-- Jobs newest first, optionally of one state, before a job id; of one owner (:owner_id) or
-- project (:project_id); and only those :viewer_id may see (its own and its projects'; NULL: an admin).
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running
FROM jobs
WHERE (:state IS NULL OR state = :state) AND (:before IS NULL OR id < :before)
  AND (:owner_id IS NULL OR user_id = :owner_id) AND (:project_id IS NULL OR project_id = :project_id)
  AND (:viewer_id IS NULL OR user_id = :viewer_id
       OR project_id IN (SELECT m.project_id FROM memberships m WHERE m.user_id = :viewer_id))
ORDER BY id DESC LIMIT :limit;

-- name: list_jobs_of_owner --
-- list_jobs for one owner (:owner_id set, the default of `job list`): walks that user's jobs alone,
-- newest first, however many other jobs there are.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at, array_size, max_running
FROM jobs INDEXED BY jobs_user_id
WHERE user_id = :owner_id AND (:state IS NULL OR state = :state) AND (:before IS NULL OR id < :before)
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

-- name: list_workers --
-- Workers with what is free on them, and whether they are cordoned: after the id :after, at most :limit (-1: all).
SELECT wl.*, w.gpu_models, w.advertise_address, w.version, w.registered_at, w.gone_reason,
       c.state AS cordon, c.reason AS cordon_reason, c.since AS cordoned_at, c.deadline AS drain_deadline,
       (SELECT json_group_array(json_object('index', g."index", 'uuid', g.uuid,
                                            'healthy', json(CASE WHEN g.healthy THEN 'true' ELSE 'false' END),
                                            'reason', g.reason))
        FROM worker_gpus g WHERE g.worker_id = wl.worker_id) AS gpu_health
FROM worker_load wl JOIN workers w ON w.id = wl.worker_id
LEFT JOIN worker_cordons c ON c.worker_id = wl.worker_id
WHERE (:include_gone OR wl.state <> 'gone') AND wl.worker_id > :after
ORDER BY wl.worker_id LIMIT :limit;

-- name: artifact_allowed_for_worker --
-- A worker may read the artifacts its active tasks name (source, inputs, weights).
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND (json_extract(j.spec, '$.source') = :digest
       OR json_extract(j.spec, '$.service.weights') = :digest
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest))
LIMIT 1;

-- name: artifact_allowed_for_user --
-- A non-admin client downloads only what a job it may read names (source, inputs, weights,
-- an output): its own jobs, its managed projects' and, in projects of visibility `project`,
-- its projects' jobs: the `read` level of teams._level, written again here.
WITH readable(id) AS (
    SELECT id FROM jobs WHERE user_id = :user_id
    UNION
    SELECT j.id FROM memberships m JOIN projects p ON p.id = m.project_id JOIN jobs j ON j.project_id = m.project_id
    WHERE m.user_id = :user_id AND (m.role = 'manager' OR p.visibility = 'project')
)
SELECT 1 AS ok FROM readable r JOIN jobs j ON j.id = r.id
WHERE json_extract(j.spec, '$.source') = :digest
   OR json_extract(j.spec, '$.service.weights') = :digest
   OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest)
   OR EXISTS (SELECT 1 FROM tasks t, json_each(t.outputs) o WHERE t.job_id = j.id AND o.value = :digest)
LIMIT 1;

-- name: worker_holds_task --
-- Does the worker hold any active task (it may upload outputs)?
SELECT 1 AS ok FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running') LIMIT 1;

-- name: record_artifact --
-- An artifact arrived (or was used again).
INSERT INTO artifacts (digest, size, created_at, last_used_at) VALUES (:digest, :size, :now, :now)
ON CONFLICT (digest) DO UPDATE SET last_used_at = excluded.last_used_at;

-- name: insert_token --
-- A minted token (only its hash).
INSERT INTO tokens (jti, kind, name, labels, token_hash, created_at, expires_at, source, user_id)
VALUES (:jti, :kind, :name, :labels, :token_hash, :now, :expires_at, :source, :user_id);

-- name: token_by_hash --
-- Authenticate a minted token by its hash.
SELECT jti, kind, name, labels, token_hash, expires_at, revoked_at, user_id FROM tokens WHERE token_hash = :token_hash;

-- name: list_tokens --
-- Minted tokens, never their hashes, in the order they were minted (`n`, the page cursor): all, or the
-- client tokens of :user_id; after :after, at most :limit (-1: all).
SELECT t.rowid AS n, t.jti, t.kind, t.name, t.labels, t.created_at, t.expires_at, t.revoked_at, t.source,
       u.name AS user
FROM tokens t LEFT JOIN users u ON u.id = t.user_id
WHERE (:user_id IS NULL OR t.user_id = :user_id) AND t.rowid > :after
ORDER BY t.rowid LIMIT :limit;

-- name: revoke_token --
-- Revoke a token once.
UPDATE tokens SET revoked_at = :now WHERE jti = :jti AND revoked_at IS NULL RETURNING jti, kind;

-- name: get_token --
-- One token, without its hash.
SELECT t.jti, t.kind, t.name, t.labels, t.created_at, t.expires_at, t.revoked_at, t.user_id, u.name AS user
FROM tokens t LEFT JOIN users u ON u.id = t.user_id WHERE t.jti = :jti;

-- name: requeue_job --
-- A released gang waits in the queue again.
UPDATE jobs SET state = 'queued' WHERE id = :job_id AND state = 'running';

-- name: worker_state --
-- A worker's state before a change.
SELECT state, gone_reason FROM workers WHERE id = :worker_id;

-- name: set_task_pid --
-- A started task reports its process id again (a retried start).
UPDATE tasks SET pid = :pid WHERE id = :task_id RETURNING id;

-- name: get_secret --
-- One secret of a project, encrypted.
SELECT name, labels, ciphertext, created_at, updated_at FROM secrets WHERE project_id = :project_id AND name = :name;

-- name: put_secret --
-- Set a secret (encrypted by the caller).
INSERT INTO secrets (project_id, name, labels, ciphertext, created_at, updated_at)
VALUES (:project_id, :name, :labels, :ciphertext, :now, :now)
ON CONFLICT (project_id, name) DO UPDATE SET labels = excluded.labels, ciphertext = excluded.ciphertext,
                                 updated_at = excluded.updated_at;

-- name: delete_secret --
-- Remove a secret.
DELETE FROM secrets WHERE project_id = :project_id AND name = :name RETURNING name;

-- name: list_secrets --
-- A project's secret names and labels, never values: by name, after :after, at most :limit (-1: all).
SELECT name, labels, created_at, updated_at FROM secrets WHERE project_id = :project_id AND name > :after
ORDER BY name LIMIT :limit;

-- name: metrics_jobs_by_state --
-- gpulayer_jobs{state}.
SELECT state, count(*) AS n FROM jobs GROUP BY state;

-- name: metrics_workers_by_state --
-- gpulayer_workers{state}.
SELECT state, count(*) AS n FROM workers GROUP BY state;

-- name: metrics_queue_by_labels --
-- gpulayer_queue_depth{labels}: queued tasks by the labels their job asks for.
SELECT j.labels, count(*) AS n FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'queued' GROUP BY j.labels;

-- name: metrics_leases_expired --
-- gpulayer_leases_expired_total: tasks lost to an expired lease, ever (not to a revocation or deregistration).
SELECT count(*) AS n FROM events WHERE kind = 'task_lost' AND json_extract(data, '$.lease_expired') = 1;

-- name: metrics_artifact_bytes --
-- gpulayer_artifact_store_bytes.
SELECT coalesce(sum(size), 0) AS bytes, count(*) AS n FROM artifacts;

-- name: unreferenced_artifacts --
-- Artifacts older than the retention cutoff that no queued, running or retained
-- (finished after the cutoff) job names: as source, input, service weights or output.
WITH live AS (
    SELECT id, spec FROM jobs WHERE state IN ('waiting', 'queued', 'running') OR finished_at >= :cutoff
),
refs(digest) AS (
    SELECT json_extract(spec, '$.source') FROM live
    UNION SELECT json_extract(spec, '$.service.weights') FROM live
    UNION SELECT i.value FROM live, json_each(live.spec, '$.inputs') i
    UNION SELECT o.value FROM tasks t JOIN live ON live.id = t.job_id, json_each(t.outputs) o
)
SELECT digest, size FROM artifacts
WHERE last_used_at < :cutoff AND digest NOT IN (SELECT digest FROM refs WHERE digest IS NOT NULL)
ORDER BY last_used_at;

-- name: delete_artifact --
-- Forget one artifact (its file is removed after the commit).
DELETE FROM artifacts WHERE digest = :digest RETURNING digest, size;

-- name: touch_artifact --
-- A job names this artifact: it counts as used now. No row back: it is not stored.
UPDATE artifacts SET last_used_at = :now WHERE digest = :digest RETURNING digest;

-- name: provision_demand --
-- Queued tasks that no online worker can take now (job_worker_fit.fits_now) and that a
-- worker of this profile could run, its join token carrying the profile's labels: the
-- reason to ask Slurm for one. :labels is the profile's labels as a JSON object; :covered
-- a JSON list of profiles ({cpus, gpus, memory_mb, labels}) already asked for, whose tasks
-- do not count. A profile is no row of `workers`, so job_worker_fit cannot judge it: its
-- fit is written here once, for the profile (shape 0) and the covered ones alike.
WITH shapes AS (
    SELECT 0 AS n, :gpus AS gpus, :cpus AS cpus, :memory_mb AS memory_mb, :labels AS labels
    UNION ALL
    SELECT 1 + c.key, json_extract(c.value, '$.gpus'), json_extract(c.value, '$.cpus'),
           json_extract(c.value, '$.memory_mb'), json_extract(c.value, '$.labels')
    FROM json_each(:covered) c
)
SELECT count(*) AS tasks
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'queued' AND t.held = 0  -- a held task (dependencies, a %N cap) asks for no worker yet
  AND NOT EXISTS (SELECT 1 FROM job_worker_fit f WHERE f.job_id = j.id AND f.fits_now)
  -- the shapes that fit it are the profile alone
  AND (SELECT group_concat(s.n) FROM shapes s
       WHERE j.gpus <= s.gpus AND j.cpus <= s.cpus AND j.memory_mb <= s.memory_mb
         AND (j.accelerator IS NULL OR s.gpus > 0)
         AND NOT EXISTS (SELECT 1 FROM json_each(j.labels) l
                         WHERE NOT EXISTS (SELECT 1 FROM json_each(s.labels) sl
                                           WHERE sl.key = l.key AND sl.value = l.value))
         AND NOT EXISTS (SELECT 1 FROM json_each(j.secrets) js
                         LEFT JOIN secrets sc ON sc.project_id = j.project_id AND sc.name = js.value
                         WHERE sc.name IS NULL
                            OR EXISTS (SELECT 1 FROM json_each(sc.labels) scl
                                       WHERE NOT EXISTS (SELECT 1 FROM json_each(s.labels) sl
                                                         WHERE sl.key = scl.key AND sl.value = scl.value)))) = '0';

-- name: insert_provision_request --
-- A decision to ask Slurm for a worker; the unique open index refuses a second open one per profile.
INSERT INTO provision_requests (provisioner, profile, state, token_jti, created_at, updated_at)
VALUES (:provisioner, :profile, 'requested', :token_jti, :now, :now)
RETURNING id;

-- name: provision_submitted --
-- sbatch accepted the job.
UPDATE provision_requests SET state = 'pending', slurm_job_id = :slurm_job_id, updated_at = :now
WHERE id = :id AND state = 'requested'
RETURNING id;

-- name: provision_attach --
-- Open requests whose token a worker registered with become attached (to its first worker).
UPDATE provision_requests AS p
SET state = 'attached', worker_id = w.first_worker, updated_at = :now, last_error = NULL
FROM (SELECT token_jti AS jti, min(id) AS first_worker FROM workers
      WHERE token_jti IS NOT NULL AND state <> 'needs_upgrade' GROUP BY token_jti) AS w
WHERE w.jti = p.token_jti AND p.state IN ('requested', 'pending')
RETURNING id, provisioner, profile, slurm_job_id, worker_id, token_jti;

-- name: provision_end --
-- An open request ends as cancelled or failed, with the reason.
UPDATE provision_requests SET state = :state, last_error = :error, updated_at = :now
WHERE id = :id AND state IN ('requested', 'pending')
RETURNING id, provisioner, profile, slurm_job_id, token_jti;

-- name: provision_note_error --
-- An open request keeps its state but shows the latest trouble (squeue unreachable, ...).
UPDATE provision_requests SET last_error = :error, updated_at = :now
WHERE id = :id AND state IN ('requested', 'pending');

-- name: open_provision_requests --
-- Requests still waiting for sbatch or for their worker, oldest first.
SELECT id, provisioner, profile, state, slurm_job_id, token_jti, created_at, updated_at
FROM provision_requests WHERE state IN ('requested', 'pending') ORDER BY id;

-- name: last_provision_request --
-- The newest request of one profile (its state and when it last changed).
SELECT id, state, updated_at FROM provision_requests
WHERE provisioner = :provisioner AND profile = :profile
ORDER BY id DESC LIMIT 1;

-- name: list_provision_requests --
-- Recent requests, newest first, with the worker that attached: before the id :before (NULL: the newest).
SELECT p.id, p.provisioner, p.profile, p.state, p.slurm_job_id, p.worker_id, w.name AS worker_name,
       w.state AS worker_state, p.last_error, p.created_at, p.updated_at
FROM provision_requests p LEFT JOIN workers w ON w.id = p.worker_id
WHERE :before IS NULL OR p.id < :before
ORDER BY p.id DESC LIMIT :limit;

-- name: job_waiting_reason --
-- Why a queued job (or a running service's queued replica) is not placed, read from
-- job_worker_fit, the view acquire and gang placement read, as facts that
-- scheduler/jobs.py puts in words. `why`: the first thing no online worker has
-- ('no_worker', 'labels', 'gpu_model', 'whole_gpus': more than one GPU where only MIG
-- instances make up the count, 'size', 'secret': `detail` names it, `secret_labels` are its
-- labels when it is set), or that only cordoned workers ('cordoned') or workers with too few
-- healthy GPUs ('unhealthy') would fit it, `detail` naming them; or, for a gang (`--nodes`)
-- or a service's replicas (one per worker), that fewer online workers than its width fit it
-- ('too_few': `fit` of them, `cordoned` of those cordoned, named in `detail`). Else `busy`
-- is 1 when fewer online workers fit it now than it needs at once (one, or a gang's width);
-- `why` NULL and `busy` 0 when an acquire would place it now. With the job's size and labels.
WITH j AS (SELECT * FROM jobs WHERE id = CAST(:job_id AS INTEGER) AND state IN ('queued', 'running')),
f AS (SELECT f.* FROM job_worker_fit f JOIN j ON f.job_id = j.id WHERE f.worker_state = 'online'),
sized AS (SELECT * FROM f WHERE has_labels AND has_accelerator AND big_enough),
usable AS (SELECT s.worker_id, w.name, w.gpus, c.state AS cordon, c.reason AS cordon_reason FROM sized s
           JOIN workers w ON w.id = s.worker_id LEFT JOIN worker_cordons c ON c.worker_id = s.worker_id
           WHERE s.missing_secret IS NULL),
uncordoned AS (SELECT u.*, u.gpus - (SELECT count(*) FROM worker_gpus g  -- GPUs out (worker_gpus)
                                  WHERE g.worker_id = u.worker_id AND g.healthy = 0) AS healthy_gpus
            FROM usable u WHERE u.cordon IS NULL),
v AS (SELECT CASE
    WHEN NOT EXISTS (SELECT 1 FROM f) THEN 'no_worker'
    WHEN NOT EXISTS (SELECT 1 FROM f WHERE has_labels) THEN 'labels'
    WHEN NOT EXISTS (SELECT 1 FROM sized) AND j.gpus > 0 AND json_extract(j.labels, '$.gpu_model') IS NOT NULL
        THEN 'gpu_model'
    WHEN NOT EXISTS (SELECT 1 FROM sized) AND j.gpus > 1 AND EXISTS (  -- shape_worker_fit.big_enough
            SELECT 1 FROM f JOIN workers w ON w.id = f.worker_id
            WHERE f.has_labels AND f.has_accelerator
              AND j.gpus <= w.gpus AND j.cpus <= w.cpus AND j.memory_mb <= w.memory_mb) THEN 'whole_gpus'
    WHEN NOT EXISTS (SELECT 1 FROM sized) THEN 'size'
    WHEN NOT EXISTS (SELECT 1 FROM usable) THEN 'secret'
    WHEN NOT EXISTS (SELECT 1 FROM uncordoned) THEN 'cordoned'  -- shape_worker_fit.schedulable
    WHEN NOT EXISTS (SELECT 1 FROM uncordoned WHERE healthy_gpus >= j.gpus) THEN 'unhealthy'
    -- even idle, too few: a gang's ranks, or a service's replicas (job_worker_fit.holds_task)
    WHEN (j.gang = 1 OR j.array_size IS NULL) AND (SELECT count(*) FROM uncordoned) < j.width THEN 'too_few'
    END AS why FROM j)
SELECT v.why, j.labels, j.accelerator, j.gpus, j.cpus, j.memory_mb, j.width, j.gang,
       CASE v.why
           WHEN 'secret' THEN (SELECT min(missing_secret) FROM sized)
           WHEN 'cordoned' THEN (SELECT group_concat(name || ' (' || cordon || ': ' || cordon_reason || ')', ', ')
                                 FROM usable)
           WHEN 'unhealthy' THEN (
               SELECT group_concat(h.name || ' (' || (
                          SELECT group_concat('GPU ' || b."index" || ': ' || b.reason, ', ')
                          FROM (SELECT g."index", g.reason FROM worker_gpus g
                                WHERE g.worker_id = h.worker_id AND g.healthy = 0 ORDER BY g."index") b) || ')', ', ')
               FROM uncordoned h)
           WHEN 'too_few' THEN (SELECT group_concat(x.name || ' (' || x.cordon || ': ' || x.cordon_reason || ')', ', ')
                                FROM (SELECT * FROM usable WHERE cordon IS NOT NULL ORDER BY name) x)
       END AS detail,
       (SELECT sc.labels FROM secrets sc
        WHERE v.why = 'secret' AND sc.project_id = j.project_id AND sc.name = (SELECT min(missing_secret) FROM sized))
           AS secret_labels,
       (SELECT count(*) FROM usable) AS fit,
       (SELECT count(*) FROM usable WHERE cordon IS NOT NULL) AS cordoned,
       (SELECT count(*) FROM f WHERE fits_now) < CASE WHEN j.gang = 1 THEN j.width ELSE 1 END AS busy
FROM j, v;

-- name: task_restart_message --
-- A service replica's last restart line ("restart 4: exited with code 1; next run in 8 s",
-- a system line of its agent), looked for among its last 200 lines only: the
-- (task_id, n) index walks back from the newest, so a chatty replica costs no more.
SELECT text FROM logs
WHERE task_id = :task_id AND stream = 'system' AND text GLOB 'restart [0-9]*'
  AND n > (SELECT max(n) FROM logs WHERE task_id = :task_id) - 200
ORDER BY n DESC LIMIT 1;

-- name: schema_objects --
-- How many tables, indexes and views a file holds (an empty file gets schema.sql).
SELECT count(*) AS n FROM sqlite_schema;

-- name: count_jobs --
-- Jobs in a state file (a backup reports what it holds).
SELECT count(*) AS n FROM jobs;

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

-- name: restored_summary --
-- What a restored state file holds: its jobs, its newest task id (the reconciliation
-- watermark: a task id above it was made after the restore), its last event's time.
SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT COALESCE(max(id), 0) FROM tasks) AS max_task_id,
       (SELECT max(at) FROM events) AS last_event_at;

-- name: grace_task_leases --
-- After the control plane was down, live task leases run at least until :until,
-- so workers that kept running get a heartbeat interval or two to report in.
UPDATE tasks SET lease_expires_at = max(lease_expires_at, :until)
WHERE state IN ('assigned', 'running') AND lease_expires_at < :until
RETURNING id;

-- name: grace_worker_leases --
-- The same grace for the leases of online workers.
UPDATE workers SET lease_expires_at = max(coalesce(lease_expires_at, 0), :until)
WHERE state = 'online' AND coalesce(lease_expires_at, 0) < :until
RETURNING id;

-- name: requeue_never_started --
-- A worker that deregisters reported every task it launched first: those still only
-- assigned never ran there and go back to the queue, same attempt (not for gangs,
-- which are placed whole).
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
    address = NULL
WHERE worker_id = :worker_id AND state = 'assigned'
  AND job_id IN (SELECT id FROM jobs WHERE gang = 0)
RETURNING id, job_id;

-- name: requeue_job_if_idle --
-- A running job whose tasks all went back to the queue is queued again.
UPDATE jobs SET state = 'queued'
WHERE id = :job_id AND state = 'running'
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE job_id = :job_id AND state IN ('assigned', 'running'))
RETURNING id;

-- name: storage_probe --
-- /v1/health after a full disk: an event row of 16 kB, so it needs new pages in the
-- file; storage_probe_undo removes it in the same transaction, whose COMMIT still writes pages.
INSERT INTO events (at, kind, data)
VALUES (0, 'storage_probe', json_object('pad', printf('%.*c', 16384, 'x'))) RETURNING seq;

-- name: storage_probe_undo --
-- The other half of storage_probe.
DELETE FROM events WHERE kind = 'storage_probe' AND at = 0 RETURNING seq;

-- name: worker_may_upload --
-- A worker uploads only outputs: it must hold an active task whose job declares some.
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND json_array_length(j.spec, '$.outputs') > 0
LIMIT 1;

-- name: artifact_recorded --
-- Is this artifact's row there? The sweep asks again, under the digest's lock, before it unlinks.
SELECT 1 AS ok FROM artifacts WHERE digest = :digest;

-- name: prune_log_jobs --
-- Retention (read, no lock): ended jobs, ended before the log cutoff, that still have log lines.
SELECT id FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost') AND finished_at < :cutoff
  AND EXISTS (SELECT 1 FROM logs WHERE logs.job_id = jobs.id)
ORDER BY id LIMIT :n;

-- name: prune_job_logs --
-- Retention: up to :n log lines of one job that ended before the cutoff.
DELETE FROM logs WHERE seq IN (
    SELECT seq FROM logs WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY seq LIMIT :n)
RETURNING seq;

-- name: prune_old_jobs --
-- Retention (read, no lock): jobs that ended before the job cutoff, oldest first.
SELECT id FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost') AND finished_at < :cutoff
ORDER BY id LIMIT :n;

-- name: prune_job_events --
-- Retention: up to :n events of one job that ended before the cutoff (its logs are gone by then).
DELETE FROM events WHERE seq IN (
    SELECT seq FROM events WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY seq LIMIT :n)
RETURNING seq;

-- name: prune_job_rendezvous --
-- Retention: the rendezvous rows of one pruned job.
DELETE FROM rendezvous WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job_dependencies --
-- Retention: up to :n of what one pruned job ran after, and of what ran after it (a job waits only
-- on a job that has not ended, so no waiting job loses a dependency here).
DELETE FROM job_dependencies WHERE rowid IN (
    SELECT rowid FROM job_dependencies WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    UNION ALL
    SELECT rowid FROM job_dependencies WHERE after_job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    LIMIT :n)
RETURNING job_id;

-- name: prune_job_tasks --
-- Retention: up to :n tasks of one pruned job, lowest id first (before the job: tasks reference it).
DELETE FROM tasks WHERE id IN (
    SELECT id FROM tasks WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY id LIMIT :n)
RETURNING id;

-- name: prune_job --
-- Retention: the job row itself, once it has no log lines, tasks, events or dependencies left.
DELETE FROM jobs WHERE id = :job_id AND finished_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM logs WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM events WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM job_dependencies WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM job_dependencies WHERE after_job_id = :job_id)
RETURNING id;

-- name: prune_loose_events --
-- Retention (read, no lock): events of no job (workers, upkeep) older than the cutoff.
SELECT seq FROM events WHERE job_id IS NULL AND at < :cutoff ORDER BY seq LIMIT :n;

-- name: prune_events --
-- Retention: delete the events prune_loose_events found, if they still qualify.
DELETE FROM events
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND job_id IS NULL AND at < :cutoff
RETURNING seq;

-- name: prune_gone_workers --
-- Retention (read, no lock): workers gone before the cutoff that no remaining task names.
SELECT id FROM workers w
WHERE state = 'gone' AND last_seen_at < :cutoff AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.worker_id = w.id)
ORDER BY id LIMIT :n;

-- name: prune_worker --
-- Retention: one departed worker's row, if it still qualifies.
DELETE FROM workers
WHERE id = :worker_id AND state = 'gone' AND last_seen_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE worker_id = :worker_id)
RETURNING id;

-- name: prune_preview --
-- `gpulayer server prune --dry-run`: what each rule would remove now
-- (:lines_cutoff is the later of the log and job cutoffs).
SELECT
  (SELECT count(*) FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                               AND finished_at < :job_cutoff) AS jobs,
  (SELECT count(*) FROM logs WHERE job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :lines_cutoff)) AS log_lines,
  (SELECT count(*) FROM events WHERE (job_id IS NULL AND at < :job_cutoff) OR job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :job_cutoff)) AS events,
  (SELECT count(*) FROM workers w WHERE state = 'gone' AND last_seen_at < :job_cutoff
      AND NOT EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.id = t.job_id
                      WHERE t.worker_id = w.id AND NOT (j.finished_at < :job_cutoff))) AS workers;

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

-- name: carry_cordon --
-- A worker registering under a name whose newest earlier registration was cordoned stays out of
-- service: the cordon is copied (cordoned stays cordoned; draining or drained is drained, as the
-- new registration holds no task).
INSERT INTO worker_cordons (worker_id, state, reason, since, deadline, drained_at)
SELECT :worker_id, CASE WHEN c.state = 'cordoned' THEN 'cordoned' ELSE 'drained' END, c.reason, c.since, NULL,
       CASE WHEN c.state = 'cordoned' THEN NULL ELSE :now END
FROM worker_cordons c
WHERE c.worker_id = (SELECT max(id) FROM workers
                     WHERE name = :name AND id <> :worker_id AND state <> 'needs_upgrade')
RETURNING state, reason, (SELECT max(id) FROM workers
                          WHERE name = :name AND id <> :worker_id AND state <> 'needs_upgrade') AS from_worker;

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
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL, reason = 'worker_drained'
WHERE id = :task_id AND worker_id = :worker_id AND state IN ('assigned', 'running') AND cancel_requested = 0
RETURNING id, job_id;

-- name: mark_drained --
-- A draining worker that holds no task any more is drained.
UPDATE worker_cordons SET state = 'drained', drained_at = :now, deadline = NULL
WHERE worker_id = :worker_id AND state = 'draining'
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running'))
RETURNING worker_id;

-- name: worker_gpus_of --
-- A worker's GPUs as the control plane knows them (health, reset pending), with its GPU count.
SELECT g."index", g.uuid, g.healthy, g.reason, g.changed_at, g.reset_pending
FROM worker_gpus g WHERE g.worker_id = :worker_id ORDER BY g."index";

-- name: worker_gpu_count --
-- How many GPUs a worker registered with (a reported index must be below it).
SELECT gpus FROM workers WHERE id = :worker_id;

-- name: put_worker_gpu --
-- Record one GPU's health as reported (a first report, a new fault, or a new UUID).
INSERT INTO worker_gpus (worker_id, "index", uuid, healthy, reason, changed_at)
VALUES (:worker_id, :index, :uuid, :healthy, :reason, :now)
ON CONFLICT (worker_id, "index") DO UPDATE
SET uuid = excluded.uuid, healthy = excluded.healthy, reason = excluded.reason, changed_at = excluded.changed_at;

-- name: reset_worker_gpu --
-- `gpulayer worker gpu-reset`: the GPU is healthy again; its agent is told on its next heartbeat.
UPDATE worker_gpus SET healthy = 1, reason = NULL, changed_at = :now, reset_pending = 1
WHERE worker_id = :worker_id AND "index" = :index
RETURNING "index", uuid;

-- name: reset_told --
-- The heartbeat answer carried the resets to an agent that reports no GPU health (so cannot mark one again).
UPDATE worker_gpus SET reset_pending = 0 WHERE worker_id = :worker_id AND reset_pending = 1;

-- name: reset_heard --
-- The agent applied the reset of this GPU (it echoed it, or reports the GPU healthy): stop telling it.
UPDATE worker_gpus SET reset_pending = 0 WHERE worker_id = :worker_id AND "index" = :index AND reset_pending = 1;

-- name: gpu_tasks_stop --
-- Active tasks holding one of the :indices (a JSON list) of a worker, not already being stopped:
-- their worker is told to stop them (cancel_requested), and reason gpu_unhealthy says why. They
-- stay active, holding every GPU index they have, until the worker reports them ended; then
-- they end lost (gpu_unhealthy), for the retry policy to judge (as worker_lost).
UPDATE tasks SET cancel_requested = 1, reason = 'gpu_unhealthy'
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND cancel_requested = 0
  AND EXISTS (SELECT 1 FROM json_each(tasks.gpu_indices) g
              WHERE g.value IN (SELECT value FROM json_each(:indices)))
RETURNING id, job_id, attempt;

-- name: metrics_workers_cordoned --
-- gpulayer_workers_cordoned{state}: workers out of service, by cordon state (not gone).
SELECT c.state, count(*) AS n FROM worker_cordons c JOIN workers w ON w.id = c.worker_id
WHERE w.state <> 'gone' GROUP BY c.state;

-- name: metrics_gpus_unhealthy --
-- gpulayer_gpus_unhealthy: unhealthy GPUs of the workers not gone.
SELECT count(*) AS n FROM worker_gpus g JOIN workers w ON w.id = g.worker_id
WHERE g.healthy = 0 AND w.state <> 'gone';

-- Teams (issue 15): users, projects, memberships, ownership (scheduler/teams.py).

-- name: user_by_id --
-- The user a client token belongs to (authentication caches the answer).
SELECT id, name, admin, max_running_jobs, created_at, removed_at FROM users WHERE id = :user_id;

-- name: user_by_name --
-- One user by name, removed or not.
SELECT id, name, admin, max_running_jobs, created_at, removed_at FROM users WHERE name = :name;

-- name: insert_user --
-- A new user; a removed one of the same name comes back (its jobs are still its own).
INSERT INTO users (name, admin, max_running_jobs, created_at) VALUES (:name, :admin, :max_running_jobs, :now)
ON CONFLICT (name) DO UPDATE SET admin = excluded.admin, max_running_jobs = excluded.max_running_jobs,
                                 removed_at = NULL
WHERE users.removed_at IS NOT NULL
RETURNING id;

-- name: update_user --
-- Change a user's admin flag or running-jobs limit (:set_limit 1 to change the limit, NULL clears it).
UPDATE users SET admin = coalesce(:admin, admin),
                 max_running_jobs = CASE WHEN :set_limit THEN :max_running_jobs ELSE max_running_jobs END
WHERE id = :user_id AND removed_at IS NULL RETURNING id;

-- name: remove_user --
-- A user leaves: marked removed (its jobs keep their owner), out of every project.
UPDATE users SET removed_at = :now WHERE id = :user_id AND removed_at IS NULL RETURNING id;

-- name: remove_user_memberships --
-- Every membership of a user.
DELETE FROM memberships WHERE user_id = :user_id;

-- name: revoke_user_tokens --
-- Every live client token of a user stops working.
UPDATE tokens SET revoked_at = :now WHERE user_id = :user_id AND revoked_at IS NULL RETURNING jti;

-- name: list_users --
-- Users that are not removed, with their projects and roles (a JSON list): by name, after :after, at most
-- :limit (-1: all).
SELECT u.id, u.name, u.admin, u.max_running_jobs, u.created_at,
       (SELECT json_group_array(json_object('project', p.name, 'role', m.role))
        FROM memberships m JOIN projects p ON p.id = m.project_id WHERE m.user_id = u.id) AS projects
FROM users u WHERE u.removed_at IS NULL AND u.name > :after ORDER BY u.name LIMIT :limit;

-- name: user_projects --
-- The projects of a user, with its role in each, by name.
SELECT p.id, p.name, m.role FROM memberships m JOIN projects p ON p.id = m.project_id
WHERE m.user_id = :user_id ORDER BY p.name;

-- name: project_by_name --
-- One project by name.
SELECT id, name, visibility, gpu_quota, gpu_borrow, weight, max_priority, created_at FROM projects WHERE name = :name;

-- name: insert_project --
-- A new project (the unique name refuses a second of the same name).
INSERT INTO projects (name, visibility, gpu_quota, gpu_borrow, weight, max_priority, created_at)
VALUES (:name, :visibility, :gpu_quota, :gpu_borrow, :weight, :max_priority, :now) RETURNING id;

-- name: update_project --
-- Change what was given of a project's settings (:set_quota / :set_weight 1 to change those, NULL clears them).
UPDATE projects SET visibility = coalesce(:visibility, visibility), gpu_borrow = coalesce(:gpu_borrow, gpu_borrow),
                    max_priority = coalesce(:max_priority, max_priority),
                    gpu_quota = CASE WHEN :set_quota THEN :gpu_quota ELSE gpu_quota END,
                    weight = CASE WHEN :set_weight THEN :weight ELSE weight END
WHERE id = :project_id RETURNING id;

-- name: project_active_jobs --
-- How many jobs of a project have not ended (a project with some cannot be removed).
SELECT count(*) AS n FROM jobs INDEXED BY jobs_project_state
WHERE project_id = :project_id AND finished_at IS NULL;

-- name: delete_project_memberships --
-- Everyone leaves a project that is removed.
DELETE FROM memberships WHERE project_id = :project_id;

-- name: delete_project_secrets --
-- The secrets of a project that is removed.
DELETE FROM secrets WHERE project_id = :project_id;

-- name: delete_project --
-- Remove a project (its ended jobs keep its id; they read as project NULL).
DELETE FROM projects WHERE id = :project_id RETURNING id;

-- name: list_projects --
-- Projects, all (:user_id NULL: an admin) or those :user_id is in, with their members (a JSON list): by
-- name, after :after, at most :limit (-1: all).
SELECT p.id, p.name, p.visibility, p.gpu_quota, p.gpu_borrow, p.weight, p.max_priority, p.created_at,
       (SELECT json_group_array(json_object('user', u.name, 'role', m.role))
        FROM memberships m JOIN users u ON u.id = m.user_id WHERE m.project_id = p.id) AS members
FROM projects p
WHERE (:user_id IS NULL OR EXISTS (SELECT 1 FROM memberships m WHERE m.project_id = p.id AND m.user_id = :user_id))
  AND p.name > :after
ORDER BY p.name LIMIT :limit;

-- name: put_membership --
-- Add a user to a project as :role, or change its role there.
INSERT INTO memberships (user_id, project_id, role) VALUES (:user_id, :project_id, :role)
ON CONFLICT (user_id, project_id) DO UPDATE SET role = excluded.role;

-- name: delete_membership --
-- A user leaves a project.
DELETE FROM memberships WHERE user_id = :user_id AND project_id = :project_id RETURNING role;

-- name: membership_role --
-- A user's role in a project, if any.
SELECT role FROM memberships WHERE user_id = :user_id AND project_id = :project_id;

-- name: project_priority_ceiling --
-- The highest priority a project's members may give a job (projects.max_priority), and its name.
SELECT name, max_priority FROM projects WHERE id = :project_id;

-- name: job_owners --
-- The owner and project names of the jobs in :ids (a JSON list), and who owns each and :user_id's role
-- in its project: what the ownership rules read (teams.job_meta).
SELECT j.id, u.name AS owner, p.name AS project, j.user_id, p.visibility, m.role
FROM jobs j LEFT JOIN users u ON u.id = j.user_id LEFT JOIN projects p ON p.id = j.project_id
LEFT JOIN memberships m ON m.project_id = j.project_id AND m.user_id = :user_id
WHERE j.id IN (SELECT value FROM json_each(:ids));

-- name: task_project --
-- The project of a task's job (its secrets are that project's).
SELECT j.project_id FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id = :task_id;

-- Teams, part B (issue 15): quotas, fair share, preemption, the usage ledger.

-- name: job_quota_reason --
-- What of acquire's admission holds a queued job back (acquire_task, next_gang_job): its
-- project's GPU quota, borrowing while another project waits within its nominal quota, or its
-- user's running-jobs limit (a running job's queued replica adds no job; an array's element
-- does, as in acquire_task); NULL when none does.
WITH j AS (SELECT * FROM jobs WHERE id = CAST(:job_id AS INTEGER) AND state IN ('queued', 'running')),
q AS (SELECT q.* FROM project_quota_use q JOIN j ON q.project_id = j.project_id),
need AS (SELECT j.gpus * CASE WHEN j.gang = 1 THEN j.width ELSE 1 END AS gpus FROM j)
SELECT CASE
    WHEN q.nominal IS NOT NULL AND j.gpus > 0 AND q.gpus_in_use + need.gpus > q.nominal + q.borrow
        THEN printf('project %s at its quota (%d + %d GPUs in use)', q.name, min(q.gpus_in_use, q.nominal), q.borrowed)
    WHEN q.nominal IS NOT NULL AND j.gpus > 0 AND q.gpus_in_use + need.gpus > q.nominal
         AND EXISTS (SELECT 1 FROM project_quota_use o
                     JOIN queue_groups g ON g.project_id = o.project_id
                     JOIN shapes s ON s.id = g.shape_id
                     WHERE o.project_id <> q.project_id AND o.nominal IS NOT NULL AND s.gpus > 0
                       AND o.gpus_in_use + s.gpus <= o.nominal)
        THEN printf('project %s may borrow beyond its quota (%d GPUs) only what no other project waits for within its own',
                    q.name, q.nominal)
    WHEN u.max_running_jobs IS NOT NULL AND (j.state = 'queued' OR j.array_size IS NOT NULL)
         AND (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
           SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                          AND t.state IN ('assigned', 'running')) END)
        FROM jobs r WHERE r.user_id = j.user_id AND r.state = 'running') >= u.max_running_jobs
        THEN printf('user %s at %d running jobs', u.name, u.max_running_jobs)
END AS reason
FROM j, q, need
LEFT JOIN users u ON u.id = j.user_id;

-- name: set_scheduler_settings --
-- The control plane's settings, written at start for the SQL that reads them.
UPDATE scheduler_settings SET fairshare_half_life_s = :half_life_s, preempt_grace_s = :preempt_grace_s
WHERE id = 1;

-- name: insert_usage --
-- The usage ledger: a row for each run of the tasks :task_ids (a JSON list) that goes back to
-- the queue now (:outcome preempted or requeued), before the requeue clears its start (a task
-- never started ran nothing: no row). Runs that end are written by the trigger tasks_run_ended.
-- Returns what fair share is charged (charge_fairshare).
INSERT INTO usage (task_id, job_id, attempt, job_name, labels, user_id, project_id, worker_id, worker_name,
                   gpus, cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome, preempted_by)
SELECT t.id, t.job_id, t.attempt, j.name, j.labels, j.user_id, j.project_id, t.worker_id, w.name,
       j.gpus, j.cpus, t.started_at, max(:now, t.started_at),
       j.gpus * max(:now - t.started_at, 0), j.cpus * max(:now - t.started_at, 0),
       :outcome, :preempted_by
FROM json_each(:task_ids) k
JOIN tasks t ON t.id = k.value
JOIN jobs j ON j.id = t.job_id
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.started_at IS NOT NULL
RETURNING project_id, user_id, CASE WHEN gpus > 0 THEN gpu_seconds ELSE cpu_seconds END AS charge;

-- name: charge_fairshare --
-- Fair share: add a requeued run's GPU-seconds (CPU-seconds without GPUs) to its user's usage
-- in its project, decaying what was there by the half-life since it was last written (as the
-- trigger tasks_run_ended does for runs that end).
INSERT INTO fairshare (project_id, user_id, usage, updated_at)
VALUES (:project_id, :user_id, :charge, :now)
ON CONFLICT (project_id, user_id) DO UPDATE
SET usage = usage * pow(0.5, max(:now - updated_at, 0) / (SELECT fairshare_half_life_s FROM scheduler_settings))
            + excluded.usage,
    updated_at = max(updated_at, :now);

-- name: usage_report --
-- `gpulayer usage` (GET /v1/usage): GPU-hours, CPU-hours, runs and jobs of the runs that
-- ended since :since, per user, project, job name or value of the label :label (:by); only
-- the runs of :user_id and of the projects :project_ids (a JSON list) when those are not NULL
-- (either may match); a page: at most :limit rows (-1: all) after the first :offset. The label is bound,
-- never made into a JSON path: any key is only data.
SELECT CASE :by WHEN 'user' THEN coalesce(us.name, '#' || u.user_id)
                WHEN 'project' THEN coalesce(pr.name, '#' || u.project_id)
                WHEN 'job-name' THEN u.job_name
                ELSE (SELECT l.value FROM json_each(u.labels) l WHERE l.key = :label) END AS key,
       sum(u.gpu_seconds) / 3600.0 AS gpu_hours, sum(u.cpu_seconds) / 3600.0 AS cpu_hours,
       count(*) AS runs, count(DISTINCT u.job_id) AS jobs, sum(u.outcome = 'preempted') AS preempted
FROM usage u
LEFT JOIN users us ON us.id = u.user_id
LEFT JOIN projects pr ON pr.id = u.project_id
WHERE u.ended_at >= :since
  AND ((:user_id IS NULL AND :project_ids IS NULL) OR u.user_id = :user_id
       OR u.project_id IN (SELECT value FROM json_each(coalesce(:project_ids, '[]'))))
GROUP BY 1
ORDER BY gpu_hours DESC, cpu_hours DESC, key
LIMIT :limit OFFSET :offset;

-- name: preemption_candidates --
-- Upkeep: queued tasks that may preempt, best first (priority with its age boost, first come, as
-- acquire_task orders them; `priority`, what it may preempt below, is the task's own): each queue group's
-- best task, when its project's quota and its user's limit would admit it (a gang: all its
-- ranks) and no preemption for it is under way (a gang: nor room held for it); with its project's
-- quota and use, and for a gang (`gang` 1) its width. (Whether workers could take it now
-- anyway is asked last, of a task with victims: shape_fits_now, gang_workers.) A gang's head
-- task stands for the job: its victims are planned on `width` distinct workers, all or none.
SELECT h.task_id, h.job_id, h.priority, h.project_id, h.shape_id, s.gpus, s.cpus, s.memory_mb, s.gang,
       CASE WHEN s.gang = 1 THEN j.width ELSE 1 END AS width, q.nominal, q.gpus_in_use
FROM queue_groups g
JOIN shapes s ON s.id = g.shape_id
JOIN task_queue h ON h.task_id = (
    SELECT x.task_id FROM task_queue x
    WHERE x.shape_id = g.shape_id AND x.project_id = g.project_id AND x.user_id = g.user_id
    ORDER BY x.priority + x.aged DESC, x.task_id LIMIT 1)
JOIN jobs j ON j.id = h.job_id
JOIN project_quota_use q ON q.project_id = g.project_id
LEFT JOIN users u ON u.id = g.user_id
WHERE (q.nominal IS NULL OR s.gpus = 0
       OR q.gpus_in_use + s.gpus * CASE WHEN s.gang = 1 THEN j.width ELSE 1 END <= q.nominal + q.borrow)
  AND (s.gang = 0 OR NOT EXISTS (SELECT 1 FROM gang_reservations r
                                 WHERE r.job_id = h.job_id AND r.expires_at > :now))
  AND (u.max_running_jobs IS NULL
       OR (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
           SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                          AND t.state IN ('assigned', 'running')) END)
        FROM jobs r WHERE r.user_id = g.user_id AND r.state = 'running') < u.max_running_jobs)
  AND NOT EXISTS (SELECT 1 FROM preemptions pe JOIN tasks v ON v.id = pe.task_id
                  WHERE pe.for_task_id = h.task_id AND pe.done_at IS NULL AND v.state IN ('assigned', 'running'))
ORDER BY h.priority + h.aged DESC, h.task_id
LIMIT :limit;

-- name: age_queued_tasks --
-- Upkeep: raise the age boost of up to :limit queued tasks that waited another :step_s seconds since
-- they became eligible (task_queue.since), one step per :step_s, to :max_aged at most: a seek of
-- task_queue_aging per step below the cap, so a round reads only the rows it raises. The task ids.
UPDATE task_queue SET aged = min(CAST(:max_aged AS INTEGER), CAST((:now - since) / :step_s AS INTEGER))
WHERE task_id IN (
    WITH RECURSIVE step(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM step WHERE k + 1 < :max_aged)
    SELECT q.task_id FROM step JOIN task_queue q ON q.aged = step.k AND q.since <= :now - (step.k + 1) * :step_s
    LIMIT :limit)
RETURNING task_id;

-- name: preemption_victims --
-- What waiting work at :priority may preempt: active tasks of running jobs that are preemptible
-- and of a lower priority (jobs_running_preemptible), or GPU tasks of the projects :borrowers (a
-- JSON list: those holding more than their nominal quota, when the waiting task's project is
-- within its own); never a task being stopped already. In the order victims are taken: per
-- worker, the lowest priority first, then the most recently started (the least work lost).
-- Read once a round for each priority; the waiting task's own checks (its job's workers, the
-- tasks it was preempted for) and which workers fit it (shape_rooms) are applied to the rows.
WITH v AS (
    SELECT j.id AS job_id, j.gang, j.gpus, j.cpus, j.memory_mb, j.priority, j.project_id, 1 AS by_priority
    FROM jobs j INDEXED BY jobs_running_preemptible
    WHERE j.state = 'running' AND j.preemptible = 1 AND j.priority < :priority
    UNION ALL
    SELECT j.id, j.gang, j.gpus, j.cpus, j.memory_mb, j.priority, j.project_id, 0
    FROM json_each(:borrowers) b
    JOIN jobs j ON j.project_id = b.value AND j.state = 'running'
    WHERE j.gpus > 0 AND NOT (j.preemptible = 1 AND j.priority < :priority)
)
SELECT t.id, t.attempt, t.worker_id, t.started_at, v.*
FROM v
JOIN tasks t ON t.job_id = v.job_id AND t.state IN ('assigned', 'running') AND t.cancel_requested = 0
ORDER BY t.worker_id, v.priority, t.started_at DESC, t.id DESC;

-- name: preemption_exclusions --
-- A waiting task's own limits on its victims: the workers where its job holds a task (one
-- replica per worker), and the tasks it was preempted for (a task never preempts those back),
-- with the whole job of those that are gangs' ranks (kind 'job'). For a gang (:gang 1), what
-- any of its tasks was preempted for.
WITH mine AS (
    SELECT :task_id AS id
    UNION
    SELECT id FROM tasks WHERE :gang = 1 AND job_id = :job_id
)
SELECT 'worker' AS kind, worker_id AS id FROM tasks
WHERE job_id = :job_id AND state IN ('assigned', 'running')
UNION ALL
SELECT 'task', pe.for_task_id FROM mine JOIN preemptions pe ON pe.task_id = mine.id
UNION ALL
SELECT 'job', pe.for_job_id FROM mine JOIN preemptions pe ON pe.task_id = mine.id
JOIN jobs f ON f.id = pe.for_job_id AND f.gang = 1;

-- name: live_gang_reservations --
-- Room held now for waiting gangs (gang_reservations not expired): preemption counts it out of
-- its worker's free room for every other waiting task.
SELECT worker_id, job_id, gpus, cpus, memory_mb FROM gang_reservations WHERE expires_at > :now;

-- name: reserve_for_gang --
-- Hold a worker's room for one rank of a waiting gang whose victims there (or elsewhere) were
-- just asked to stop: until the preemption grace and two lease TTLs have passed.
INSERT INTO gang_reservations (worker_id, job_id, gpus, cpus, memory_mb, reserved_at, expires_at)
SELECT :worker_id, j.id, j.gpus, j.cpus, j.memory_mb, :now, :now + st.preempt_grace_s + 2 * :lease_ttl_s
FROM jobs j, scheduler_settings st
WHERE j.id = :job_id AND j.state = 'queued' AND j.gang = 1
ON CONFLICT (worker_id, job_id) DO UPDATE SET reserved_at = excluded.reserved_at, expires_at = excluded.expires_at;

-- name: expire_gang_reservations --
-- Room held for a gang that was not placed in time is free again.
DELETE FROM gang_reservations WHERE expires_at <= :now;

-- name: shape_rooms --
-- The online, schedulable workers a shape fits when idle (shape_worker_fit), with their free
-- room now: where preemption may make room for a waiting task of the shape.
SELECT l.worker_id, l.free_slots, l.free_gpus, l.free_cpus, l.free_memory_mb
FROM shape_worker_fit f
JOIN worker_load l ON l.worker_id = f.worker_id
WHERE f.shape_id = CAST(:shape_id AS INTEGER) AND f.worker_state = 'online' AND f.fits AND f.schedulable;

-- name: request_preemption --
-- Ask a victim's worker to stop it (its next heartbeat's cancel list) and note why.
INSERT INTO preemptions (task_id, job_id, worker_id, for_task_id, for_job_id, reason, asked_at)
SELECT t.id, t.job_id, t.worker_id, :for_task_id, :for_job_id, :reason, :now
FROM tasks t
WHERE t.id = :task_id AND t.state IN ('assigned', 'running') AND t.cancel_requested = 0
RETURNING task_id, job_id, worker_id;

-- name: mark_preempted --
-- The victim's cancel flag, in the transaction that chose it.
UPDATE tasks SET cancel_requested = 1 WHERE id = :task_id AND state IN ('assigned', 'running');

-- name: pending_preemption --
-- The preemption asked for this task while it holds its current assignment (none: NULL row).
SELECT pe.id, pe.for_task_id, pe.for_job_id, pe.reason
FROM preemptions pe JOIN tasks t ON t.id = pe.task_id
WHERE pe.task_id = :task_id AND pe.done_at IS NULL AND pe.asked_at >= t.assigned_at
  AND t.state IN ('assigned', 'running')
ORDER BY pe.id DESC LIMIT 1;

-- name: requeue_preempted --
-- A preempted task that stopped goes back to the queue, same attempt, holding nothing.
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL, cancel_requested = 0, reason = 'preempted'
WHERE id = :task_id AND worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt;

-- name: lost_preemption_victims --
-- Victims whose worker was lost during their grace, before they are settled lost: those of
-- :worker_id (leaving), or with :worker_id NULL those whose lease, or whose worker's, passed
-- (as expire_task_leases). They go back to the queue as preempted (preemption.requeue).
SELECT t.id, t.job_id, t.attempt, t.worker_id
FROM preemptions pe INDEXED BY preemptions_worker
JOIN tasks t ON t.id = pe.task_id AND pe.asked_at >= t.assigned_at
WHERE pe.done_at IS NULL AND t.state IN ('assigned', 'running')
  AND (t.worker_id = :worker_id
       OR (:worker_id IS NULL
           AND (t.lease_expires_at < :now
                OR t.worker_id IN (SELECT id FROM workers WHERE state = 'online' AND lease_expires_at < :now))));


-- name: preemption_done --
-- The victim stopped and is queued again.
UPDATE preemptions SET done_at = :now WHERE id = :id AND done_at IS NULL;

-- name: worker_preempting --
-- The tasks this worker is asked to stop for a preemption (its heartbeat names them, with the grace).
SELECT pe.task_id, st.preempt_grace_s
FROM preemptions pe
JOIN tasks t ON t.id = pe.task_id
CROSS JOIN scheduler_settings st
WHERE pe.worker_id = :worker_id AND pe.done_at IS NULL AND t.worker_id = :worker_id
  AND t.state IN ('assigned', 'running') AND pe.asked_at >= t.assigned_at;

-- name: task_was_preempted --
-- Was this task stopped for a preemption before (its next run gets GPULAYER_PREEMPTED=1)?
SELECT 1 AS found FROM preemptions WHERE task_id = :task_id AND done_at IS NOT NULL LIMIT 1;

-- name: job_preemptions --
-- A job's tasks preempted (or being preempted), oldest first: `job status` shows them; the latest :limit.
SELECT task_id, worker_id, for_task_id, for_job_id, reason, asked_at, done_at FROM (
    SELECT pe.id, pe.task_id, pe.worker_id, pe.for_task_id, pe.for_job_id, pe.reason, pe.asked_at, pe.done_at
    FROM preemptions pe
    WHERE pe.task_id IN (SELECT id FROM tasks WHERE job_id = :job_id)
    ORDER BY pe.id DESC LIMIT :limit)
ORDER BY id;

-- name: managed_projects --
-- The projects a user manages (their usage is theirs to read).
SELECT project_id FROM memberships WHERE user_id = :user_id AND role = 'manager' ORDER BY project_id;

-- name: preemption_possible --
-- What a preemption round may take at all: the lowest priority of a running preemptible job
-- (NULL: none), and the projects holding more than their nominal quota (borrowers, with their
-- nominal quota and GPUs in use, a JSON object by id; '{}' when none). Upkeep skips the round
-- when there is neither.
SELECT (SELECT min(priority) FROM jobs INDEXED BY jobs_running_preemptible
        WHERE state = 'running' AND preemptible = 1) AS floor,
       CASE WHEN EXISTS (SELECT 1 FROM projects WHERE gpu_quota IS NOT NULL) THEN (
           SELECT json_group_object(project_id, json_object('nominal', nominal, 'gpus_in_use', gpus_in_use))
           FROM project_quota_use WHERE borrowed > 0) ELSE '{}' END AS borrowers;

-- name: shape_fits_now --
-- Could an online worker take a task of this shape now (shape_worker_fit.fits_now)? Preemption
-- asks it last, of a waiting task it found victims for: then it waits for acquire instead.
SELECT 1 AS found FROM shape_worker_fit WHERE shape_id = CAST(:shape_id AS INTEGER) AND fits_now LIMIT 1;

-- name: task_log_base --
-- The number a task's next log line gets (its Assignment's log_base): after those already stored.
SELECT coalesce(max(n) + 1, 0) AS n FROM logs WHERE task_id = :task_id;

-- name: prune_job_preemptions --
-- Retention: the preemptions of the :n tasks prune_job_tasks removes next (the usage ledger's rows
-- keep preempted_by). (Read through the job's tasks, before they go: preemptions_task serves it.)
DELETE FROM preemptions WHERE task_id IN (SELECT id FROM tasks WHERE job_id = :job_id ORDER BY id LIMIT :n)
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
RETURNING id;

-- name: clear_fairshare_running --
-- Fair share's running part is rewritten whole (set_fairshare_running): first every row to 0.
UPDATE fairshare SET running = 0 WHERE running > 0;

-- name: set_fairshare_running --
-- Fair share's view of the runs still going: each (project, user)'s GPU-seconds (CPU-seconds
-- without GPUs) so far, from the running tasks (the partial index tasks_lease); upkeep writes it
-- every few seconds, so a project's long runs weigh while they run, not only once they end.
INSERT INTO fairshare (project_id, user_id, usage, updated_at, running)
SELECT j.project_id, j.user_id, 0, :now,
       sum(CASE WHEN j.gpus > 0 THEN j.gpus ELSE j.cpus END * max(:now - t.started_at, 0))
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state IN ('assigned', 'running') AND t.state = 'running' AND t.started_at IS NOT NULL
GROUP BY j.project_id, j.user_id
ON CONFLICT (project_id, user_id) DO UPDATE SET running = excluded.running;
