-- The explorer's SQL, read once by explorer/queries.py.
--
-- Each block starts with `-- name: NAME --`, then one `-- ` line that says
-- what it answers, then the statement. Blocks whose name starts with `page_`
-- feed the explorer's own pages; every other block is a canned query listed at
-- /-/queries/NAME. Parameters are named (`:job_id`); `:now`, `:since` and
-- `:until` default to now, seven days ago and now (Unix seconds).
-- Every query here stays readable by the stock sqlite3 3.40 CLI.

-- name: queued_jobs --
-- Jobs with queued tasks, best first, the first thing each waits for, as a word (no_worker, labels, accelerator, size, secret, cordoned, unhealthy, gpus_busy, busy, gang_busy; empty: a worker fits now), and, for a queued one, when it is expected to start (estimated_start_at, Unix seconds, from the control plane's latest forecast; estimate_reason when that cannot be known).
WITH waiting AS (
    SELECT j.id AS job_id, j.name, j.state, j.priority, j.labels, j.accelerator,
           j.gpus, j.cpus, j.memory_mb, j.width, j.gang,
           count(t.id) AS queued_tasks, min(t.created_at) AS queued_since
    FROM jobs j
    JOIN tasks t ON t.job_id = j.id AND t.state = 'queued' AND t.held = 0  -- held: waits for dependencies or a %N cap
    GROUP BY j.id
),
pairs AS (
    -- job_worker_fit is the fit acquire and gang placement read; worker_load adds free GPUs
    SELECT q.job_id, f.worker_id, f.has_labels, f.has_accelerator, f.big_enough, f.missing_secret,
           f.fits, f.fits_now, (w.free_gpus >= q.gpus) AS gpus_free,
           (w.gpus - w.unhealthy_gpus >= q.gpus) AS healthy_enough,
           NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = f.worker_id) AS schedulable
    FROM waiting q
    JOIN job_worker_fit f ON f.job_id = q.job_id AND f.worker_state = 'online'
    JOIN worker_load w ON w.worker_id = f.worker_id
),
fits AS (
    SELECT q.job_id,
           count(p.worker_id) AS online,
           coalesce(sum(p.has_labels), 0) AS with_labels,
           coalesce(sum(p.has_labels AND p.has_accelerator), 0) AS with_accelerator,
           coalesce(sum(p.has_labels AND p.has_accelerator AND p.big_enough), 0) AS big_enough,
           min(CASE WHEN p.has_labels AND p.has_accelerator AND p.big_enough THEN p.missing_secret END) AS missing_secret,
           coalesce(sum(p.fits), 0) AS fits,
           coalesce(sum(p.fits AND p.schedulable), 0) AS fits_open,
           coalesce(sum(p.fits AND p.schedulable AND p.healthy_enough), 0) AS fits_healthy,
           coalesce(sum(p.fits AND p.schedulable AND p.gpus_free), 0) AS gpus_free,
           coalesce(sum(p.fits_now), 0) AS fit_now
    FROM waiting q
    LEFT JOIN pairs p ON p.job_id = q.job_id
    GROUP BY q.job_id
)
SELECT q.job_id, q.name, q.state, q.priority, q.queued_tasks, q.width, q.gpus, q.cpus, q.memory_mb, q.accelerator,
       q.labels, q.queued_since, f.fit_now AS workers_that_fit_now,
       -- a word, not a sentence: the CLI's `job status` says it in words (scheduler/waiting.py)
       CASE
           WHEN f.online = 0 THEN 'no_worker'                  -- no online worker
           WHEN f.with_labels = 0 THEN 'labels'                -- none has the labels
           WHEN f.with_accelerator = 0 THEN 'accelerator'      -- none with the labels has the accelerator
           WHEN f.big_enough = 0 THEN 'size'                   -- none with them is big enough (gpus, cpus, memory_mb)
           WHEN f.fits = 0 THEN 'secret'                       -- none that fits may receive missing_secret
           WHEN f.fits_open = 0 THEN 'cordoned'                -- only cordoned workers fit it (gpulayer worker uncordon)
           WHEN f.fits_healthy = 0 THEN 'unhealthy'            -- only workers with unhealthy GPUs would fit it
           WHEN f.gpus_free = 0 THEN 'gpus_busy'               -- none that fits has `gpus` free GPUs
           WHEN f.fit_now = 0 THEN 'busy'                      -- no free slot (or CPUs, memory) on those that fit
           WHEN q.gang AND f.fit_now < q.width THEN 'gang_busy'  -- fewer than `width` workers fit it now
       END AS waits_for,
       CASE WHEN f.online > 0 AND f.with_labels > 0 AND f.with_accelerator > 0 AND f.big_enough > 0 AND f.fits = 0
            THEN f.missing_secret END AS missing_secret,
       -- the latest forecast's (docs/scheduling-time.md); only while the job waits to start
       CASE WHEN q.state = 'queued' THEN e.start_at END AS estimated_start_at,
       CASE WHEN q.state = 'queued' THEN e.reason END AS estimate_reason
FROM waiting q
JOIN fits f ON f.job_id = q.job_id
LEFT JOIN estimates e ON e.job_id = q.job_id
ORDER BY q.priority DESC, q.job_id;

-- name: running_tasks --
-- Tasks assigned or running now, with their worker, address and service endpoint.
SELECT t.id AS task_id, t.job_id, j.name AS job_name, j.kind, t."index", t.attempt, t.state,
       t.worker_id, w.name AS worker_name, t.address, t.endpoint, t.restarts, t.gpu_indices,
       t.started_at, t.lease_expires_at
FROM tasks t
JOIN jobs j ON j.id = t.job_id
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.state IN ('assigned', 'running')
ORDER BY t.job_id, t."index", t.id;

-- name: lost_tasks --
-- Tasks lost in the 24 hours before :now, newest first, with the worker each was on.
SELECT t.id AS task_id, t.job_id, j.name AS job_name, t."index", t.attempt, t.finished_at AS lost_at,
       t.reason, t.worker_id, w.name AS worker_name, w.state AS worker_state, w.gone_reason,
       w.last_seen_at AS worker_last_seen_at
FROM tasks t
JOIN jobs j ON j.id = t.job_id
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.state = 'lost' AND t.finished_at >= :now - 86400 AND t.finished_at <= :now
ORDER BY t.finished_at DESC, t.id DESC;

-- name: worker_load --
-- Attached workers (not gone) with their tasks and free slots, GPUs, CPUs and memory, most free GPUs first;
-- fractions of a GPU: the worker's sharing mode, the GPUs shares hold and the shares held on them (in GPUs).
SELECT worker_id, name, state, labels, slots, active_tasks, free_slots, gpus, free_gpus,
       cpus, free_cpus, memory_mb, free_memory_mb, last_seen_at, lease_expires_at,
       gpu_sharing, shared_gpus, gpu_share_used
FROM worker_load
WHERE state <> 'gone'
ORDER BY state = 'online' DESC, free_gpus DESC, name;

-- name: job_timeline --
-- Every event of job :job_id in order, with the seconds since its first event (to the millisecond).
SELECT e.seq, e.at, round(e.at - first_value(e.at) OVER (ORDER BY e.seq), 3) AS after_s,
       e.kind, e.task_id, e.worker_id, e.data
FROM events e
WHERE e.job_id = :job_id
ORDER BY e.seq;

-- name: gpu_hours_by_label --
-- GPU-hours used between :since and :until by job label (key=value); running tasks count up to :until.
WITH usage AS (
    SELECT j.id AS job_id, j.labels,
           j.gpus * (min(coalesce(t.finished_at, :until), :until) - max(t.started_at, :since)) AS gpu_seconds
    FROM tasks t
    JOIN jobs j ON j.id = t.job_id
    WHERE j.gpus > 0 AND t.started_at IS NOT NULL
      AND t.started_at < :until AND coalesce(t.finished_at, :until) > :since
)
SELECT coalesce(l.key || '=' || l.value, '(no labels)') AS label,
       round(sum(u.gpu_seconds) / 3600.0, 3) AS gpu_hours,
       count(DISTINCT u.job_id) AS jobs
FROM usage u
LEFT JOIN json_each(u.labels) l
GROUP BY 1
ORDER BY gpu_hours DESC, label;

-- name: gpu_hours_by_job_name --
-- GPU-hours used between :since and :until by job name; running tasks count up to :until.
WITH usage AS (
    SELECT j.id AS job_id, j.name,
           j.gpus * (min(coalesce(t.finished_at, :until), :until) - max(t.started_at, :since)) AS gpu_seconds
    FROM tasks t
    JOIN jobs j ON j.id = t.job_id
    WHERE j.gpus > 0 AND t.started_at IS NOT NULL
      AND t.started_at < :until AND coalesce(t.finished_at, :until) > :since
)
SELECT coalesce(name, '(unnamed)') AS job_name,
       round(sum(gpu_seconds) / 3600.0, 3) AS gpu_hours,
       count(DISTINCT job_id) AS jobs
FROM usage
GROUP BY 1
ORDER BY gpu_hours DESC, job_name;

-- name: page_tables --
-- The tables and views the index page lists (SQLite's own tables left out).
SELECT name, type
FROM sqlite_master
WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'
ORDER BY type, name;

-- name: page_columns --
-- The columns of table or view :table, in order; pk is the column's place in the primary key (0: not in it).
SELECT name, type, pk
FROM pragma_table_xinfo(:table)
WHERE hidden = 0
ORDER BY cid;

-- name: page_job --
-- Job :job_id as stored, with its owner and project names, its command, its task counts (as job_summary counts them), and a service's ingress access (token, key,
-- public; null: none), whose URL is /ingress/<job id> on the control plane that serves this explorer.
SELECT j.id AS job_id, j.name, j.state, j.kind, j.priority, j.attempt, j.max_attempts,
       j.width, j.gang, j.gpus, j.cpus, j.memory_mb, j.accelerator, j.labels, j.array_size, j.max_running,
       s.queued_tasks, s.active_tasks, s.lost_tasks, j.exit_code, j.reason,
       j.created_at, s.first_started_at, j.finished_at, j.spec,
       json_extract(j.spec, '$.command') AS command,
       coalesce(u.name, '#' || j.user_id) AS owner, coalesce(p.name, '#' || j.project_id) AS project,
       json_extract(j.spec, '$.service.ingress.access') AS ingress
FROM jobs j
-- job_summary's numbers in one pass over the job's tasks (not one per number: an array has 100,000),
-- the two counts of what is left to run from the partial index that holds only that
CROSS JOIN (SELECT min(t.started_at) AS first_started_at, coalesce(sum(t.state = 'lost'), 0) AS lost_tasks,
                   (SELECT count(*) FROM tasks q INDEXED BY tasks_job_active
                    WHERE q.state IN ('queued', 'assigned', 'running') AND q.job_id = :job_id
                      AND q.state = 'queued') AS queued_tasks,
                   (SELECT count(*) FROM tasks q INDEXED BY tasks_job_active
                    WHERE q.state IN ('queued', 'assigned', 'running') AND q.job_id = :job_id
                      AND q.state IN ('assigned', 'running')) AS active_tasks
            FROM tasks t WHERE t.job_id = :job_id) s
LEFT JOIN users u ON u.id = j.user_id
LEFT JOIN projects p ON p.id = j.project_id
WHERE j.id = :job_id;

-- name: page_job_tasks --
-- Every task of job :job_id, every attempt, in attempt and replica order (its worker's name links to the
-- worker's page; the address is the worker's, on that page).
SELECT t.id AS task_id, t.attempt, t."index", t.state, t.worker_id, w.name AS worker_name,
       t.gpu_indices, t.endpoint, t.restarts, t.exit_code, t.outcome, t.reason,
       t.started_at, t.finished_at
FROM tasks t
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id
ORDER BY t.attempt, t."index", t.id;

-- name: page_job_endpoints --
-- The replicas of service job :job_id that serve now (the endpoints view).
SELECT task_id, replica, attempt, worker_id, worker_name, endpoint, restarts, state
FROM endpoints
WHERE job_id = :job_id
ORDER BY replica;

-- name: page_job_scaling --
-- The autoscaling decisions of service job :job_id, oldest first: its replicas over time (service_scaling).
SELECT at, from_replicas, to_replicas, why, load, in_flight, ready
FROM service_scaling
WHERE job_id = :job_id
ORDER BY at, id;

-- name: page_job_logs --
-- The last :limit log lines of job :job_id, oldest first.
SELECT seq, task_id, stream, at, text
FROM (SELECT seq, task_id, stream, at, text
      FROM logs
      WHERE job_id = :job_id
      ORDER BY seq DESC
      LIMIT :limit)
ORDER BY seq;

-- name: page_workers --
-- Attached workers (online, offline, needs_upgrade) with what they have, use and have free,
-- whether an operator cordoned them, their GPUs' health as their agents report it, and how they
-- isolate their tasks (`isolation`, the agent's JSON: sandbox, user, warning).
SELECT l.worker_id, l.name, l.state, l.labels, w.advertise_address, w.version, w.isolation,
       l.slots, l.active_tasks, l.free_slots,
       l.gpus, l.gpus - l.free_gpus - l.unhealthy_gpus AS used_gpus, l.free_gpus, w.gpu_models,
       l.gpu_sharing, l.shared_gpus, l.gpu_share_used,
       l.cpus, l.cpus - l.free_cpus AS used_cpus, l.free_cpus,
       l.memory_mb, l.memory_mb - l.free_memory_mb AS used_memory_mb, l.free_memory_mb,
       l.last_seen_at, l.lease_expires_at,
       c.state AS cordon, c.reason AS cordon_reason, c.deadline AS drain_deadline, l.unhealthy_gpus,
       (SELECT group_concat(g."index" || ': ' || g.reason, '; ') FROM worker_gpus g
        WHERE g.worker_id = l.worker_id AND g.healthy = 0) AS unhealthy
FROM worker_load l
JOIN workers w ON w.id = l.worker_id
LEFT JOIN worker_cordons c ON c.worker_id = l.worker_id
WHERE l.state <> 'gone'
ORDER BY l.state = 'online' DESC, l.name, l.worker_id;

-- name: page_unmatched_tasks --
-- Queued tasks that no attached worker could take even when idle (labels, accelerator, size or secrets), best first: each job judged once, not once per task (an array's 100,000 elements are one question).
WITH waiting AS (
    SELECT DISTINCT job_id FROM tasks WHERE state = 'queued' AND held = 0
),
unmatched AS (
    SELECT q.job_id FROM waiting q
    WHERE NOT EXISTS (SELECT 1 FROM job_worker_fit f WHERE f.job_id = q.job_id AND f.worker_state <> 'gone' AND f.fits)
)
SELECT t.id AS task_id, t.job_id, j.name AS job_name, t."index", t.attempt, t.priority,
       j.labels, j.accelerator, j.gpus, j.cpus, j.memory_mb, t.created_at
FROM unmatched u
JOIN jobs j ON j.id = u.job_id
JOIN tasks t ON t.job_id = u.job_id AND t.state = 'queued' AND t.held = 0
ORDER BY t.priority DESC, t.id;

-- name: page_provision_requests --
-- The latest provision requests, newest first (Slurm jobs and Kubernetes Pods asked for by the provisioners of
-- provisioners.json: docs/operations.md, "Slurm provisioning", and docs/kubernetes.md): each one's state, its Slurm
-- job or Pod, the worker it brought, and its last error (a refusal of the API or sbatch, an image that will not pull,
-- a timeout).
SELECT p.id, p.provisioner, p.profile, p.state, p.slurm_job_id AS job_or_pod, w.name AS worker, p.updated_at,
       p.last_error
FROM provision_requests p
LEFT JOIN workers w ON w.id = p.worker_id
ORDER BY p.id DESC
LIMIT 20;

-- name: gpu_hours_by_user --
-- GPU-hours, CPU-hours, jobs and runs per user from the usage ledger, of runs that ended between :since and :until.
SELECT coalesce(us.name, '#' || u.user_id) AS user, round(sum(u.gpu_seconds) / 3600.0, 3) AS gpu_hours,
       round(sum(u.cpu_seconds) / 3600.0, 3) AS cpu_hours, count(DISTINCT u.job_id) AS jobs, count(*) AS runs,
       sum(u.outcome = 'preempted') AS preempted_runs
FROM usage u
LEFT JOIN users us ON us.id = u.user_id
WHERE u.ended_at >= :since AND u.ended_at <= :until
GROUP BY u.user_id
ORDER BY gpu_hours DESC, cpu_hours DESC;

-- name: gpu_hours_by_project --
-- GPU-hours, CPU-hours, jobs and runs per project from the usage ledger, of runs that ended between :since and :until.
SELECT coalesce(p.name, '#' || u.project_id) AS project, round(sum(u.gpu_seconds) / 3600.0, 3) AS gpu_hours,
       round(sum(u.cpu_seconds) / 3600.0, 3) AS cpu_hours, count(DISTINCT u.job_id) AS jobs, count(*) AS runs,
       sum(u.outcome = 'preempted') AS preempted_runs
FROM usage u
LEFT JOIN projects p ON p.id = u.project_id
WHERE u.ended_at >= :since AND u.ended_at <= :until
GROUP BY u.project_id
ORDER BY gpu_hours DESC, cpu_hours DESC;

-- name: gpu_hours_by_week --
-- GPU-hours per ISO week (Monday first) and project from the usage ledger, of runs that ended between :since and :until.
SELECT date(u.ended_at, 'unixepoch', 'weekday 0', '-6 days') AS week_of,
       coalesce(p.name, '#' || u.project_id) AS project, round(sum(u.gpu_seconds) / 3600.0, 3) AS gpu_hours,
       count(DISTINCT u.job_id) AS jobs
FROM usage u
LEFT JOIN projects p ON p.id = u.project_id
WHERE u.ended_at >= :since AND u.ended_at <= :until
GROUP BY week_of, u.project_id
ORDER BY week_of DESC, gpu_hours DESC;

-- name: gpus_held_idle --
-- GPUs held idle: GPU-hours tasks held between :since and :until (seven days by default) and those under the idle threshold (the job's idle_below_pct, else its project's, else 5%), by user and project, from gpu_samples (each sample counts the time since the one before it on that GPU, at most 60 s); idle_pct is their share. Runs requeued by a preemption keep no GPU indices, so are not counted.
WITH held AS (
    SELECT t.id AS task_id, t.worker_id, CAST(g.value AS INTEGER) AS gpu_index, t.started_at,
           coalesce(t.finished_at, :until) AS ended_at, j.user_id, j.project_id,
           coalesce(json_extract(j.spec, '$.idle_below_pct'), p.idle_below_pct, 5.0) AS below_pct
    FROM tasks t
    JOIN jobs j ON j.id = t.job_id
    LEFT JOIN projects p ON p.id = j.project_id, json_each(t.gpu_indices) g
    WHERE t.started_at IS NOT NULL AND t.started_at <= :until AND coalesce(t.finished_at, :until) >= :since
),
samples AS (
    SELECT s.worker_id, s.gpu_index, s.at, s.utilization_pct,
           min(s.at - lag(s.at) OVER (PARTITION BY s.worker_id, s.gpu_index ORDER BY s.at), 60.0) AS seconds
    FROM gpu_samples s
    WHERE s.at >= :since AND s.at <= :until
)
SELECT coalesce(u.name, '#' || h.user_id) AS user, coalesce(p.name, '#' || h.project_id) AS project,
       round(sum(s.seconds) / 3600.0, 3) AS gpu_hours_held,
       round(sum(CASE WHEN s.utilization_pct < h.below_pct THEN s.seconds ELSE 0 END) / 3600.0, 3) AS gpu_hours_idle,
       round(100.0 * sum(CASE WHEN s.utilization_pct < h.below_pct THEN s.seconds ELSE 0 END)
             / nullif(sum(s.seconds), 0), 1) AS idle_pct,
       count(DISTINCT h.task_id) AS tasks
FROM held h
JOIN samples s ON s.worker_id = h.worker_id AND s.gpu_index = h.gpu_index AND s.at > h.started_at
              AND s.at <= h.ended_at AND s.seconds IS NOT NULL
LEFT JOIN users u ON u.id = h.user_id
LEFT JOIN projects p ON p.id = h.project_id
GROUP BY h.user_id, h.project_id
ORDER BY gpu_hours_idle DESC, gpu_hours_held DESC;

-- name: quota_use_now --
-- Each project's GPU quota (nominal + borrow), the GPUs its tasks hold now, how many of them borrowed, and its queued tasks.
SELECT name AS project, nominal, borrow, weight, gpus_in_use, borrowed, running_jobs, queued_tasks
FROM project_quota_use
ORDER BY gpus_in_use DESC, name;

-- name: who_preempts_whom --
-- Preemptions asked between :since and :until, newest first: the victim task and job, the task that needed the room, why, and when it was requeued.
SELECT pe.asked_at, pe.reason, pe.task_id AS victim_task, pe.job_id AS victim_job,
       coalesce(vu.name, '#' || vj.user_id) AS victim_user, pe.for_task_id AS for_task, pe.for_job_id AS for_job,
       coalesce(fu.name, '#' || fj.user_id) AS for_user, pe.worker_id, pe.done_at AS requeued_at
FROM preemptions pe
LEFT JOIN jobs vj ON vj.id = pe.job_id
LEFT JOIN users vu ON vu.id = vj.user_id
LEFT JOIN jobs fj ON fj.id = pe.for_job_id
LEFT JOIN users fu ON fu.id = fj.user_id
WHERE pe.asked_at >= :since AND pe.asked_at <= :until
ORDER BY pe.asked_at DESC, pe.id DESC;

-- name: page_home_jobs --
-- Jobs queued, waiting or running now, newest first, at most :limit, with their command, owner, project and, for an array, its elements queued and active now (tasks_job_active).
SELECT j.id AS job_id, j.name, json_extract(j.spec, '$.command') AS command, coalesce(u.name, '#' || j.user_id) AS owner,
       coalesce(p.name, '#' || j.project_id) AS project, j.state, j.kind, j.gpus, j.width, j.array_size,
       -- INDEXED BY: the partial index holds only what is left to run; tasks_job would read every element
       -- (its WHERE repeated word for word, so that SQLite sees the partial index applies)
       (SELECT count(*) FROM tasks t INDEXED BY tasks_job_active
        WHERE t.state IN ('queued', 'assigned', 'running') AND t.job_id = j.id AND t.state = 'queued') AS queued_tasks,
       (SELECT count(*) FROM tasks t INDEXED BY tasks_job_active
        WHERE t.state IN ('queued', 'assigned', 'running') AND t.job_id = j.id AND t.state IN ('assigned', 'running'))
           AS active_tasks,
       j.created_at, j.finished_at
FROM (SELECT id FROM jobs WHERE state IN ('queued', 'waiting', 'running')  -- ids first (jobs_state_id): the
      ORDER BY id DESC LIMIT :limit) a                                     -- counts run for :limit jobs only
JOIN jobs j ON j.id = a.id
LEFT JOIN users u ON u.id = j.user_id
LEFT JOIN projects p ON p.id = j.project_id
ORDER BY j.id DESC;

-- name: page_home_active_count --
-- How many jobs are queued, waiting or running now (jobs_state_id), counted up to :cap.
SELECT count(*) AS jobs FROM (SELECT 1 FROM jobs WHERE state IN ('queued', 'waiting', 'running') LIMIT :cap);

-- name: page_home_ended_jobs --
-- Jobs that ended between :since and :until, newest end first, at most :limit: found by their job_finished events (events_kind_at), not by a walk of the jobs table.
SELECT j.id AS job_id, j.name, json_extract(j.spec, '$.command') AS command, coalesce(u.name, '#' || j.user_id) AS owner,
       coalesce(p.name, '#' || j.project_id) AS project, j.state, j.kind, j.gpus, j.width, j.array_size,
       0 AS queued_tasks, 0 AS active_tasks, j.created_at, j.finished_at
FROM (SELECT DISTINCT job_id FROM events
      WHERE kind = 'job_finished' AND at >= :since AND at <= :until
      ORDER BY at DESC LIMIT :limit) e
JOIN jobs j ON j.id = e.job_id
LEFT JOIN users u ON u.id = j.user_id
LEFT JOIN projects p ON p.id = j.project_id
WHERE j.finished_at IS NOT NULL
ORDER BY j.finished_at DESC, j.id DESC;

-- name: page_home_workers --
-- Attached workers (online, offline, needs_upgrade), at most :limit, with their GPUs: how many, unhealthy, and the indices the active tasks hold.
SELECT l.worker_id, l.name, l.state, l.gpus, l.unhealthy_gpus, l.active_tasks, l.slots, w.gpu_models,
       c.state AS cordon,
       (SELECT json_group_array(g."index") FROM worker_gpus g WHERE g.worker_id = l.worker_id AND g.healthy = 0)
           AS unhealthy_indices,
       (SELECT json_group_array(x.value) FROM tasks t, json_each(t.gpu_indices) x
        WHERE t.worker_id = l.worker_id AND t.state IN ('assigned', 'running') AND t.ahead = 0) AS busy_indices,
       l.last_seen_at
FROM worker_load l
JOIN workers w ON w.id = l.worker_id
LEFT JOIN worker_cordons c ON c.worker_id = l.worker_id
WHERE l.state <> 'gone'
ORDER BY l.state = 'online' DESC, l.name, l.worker_id
LIMIT :limit;

-- name: page_chart_tasks --
-- Queued and running tasks between :since and :until in buckets of :step seconds: per bucket, the sum of the changes (+1 a task entering the state, -1 leaving it) and of each change times the seconds from it to the bucket's end; explorer/charts.py turns them into the average count per bucket. Runs come from the usage ledger (usage_ended) and the tasks active now; queued spans from the tasks queued or active now and those whose run ended in the window.
WITH spans(series, entered, left_at) AS (
    SELECT 'running', u.started_at, u.ended_at FROM usage u
    WHERE u.ended_at >= :since AND u.started_at < :until
    UNION ALL
    SELECT 'running', t.started_at, NULL FROM tasks t
    WHERE t.state IN ('assigned', 'running') AND t.started_at IS NOT NULL
    UNION ALL
    SELECT 'queued', coalesce(t.queued_at, t.created_at), NULL FROM tasks t
    WHERE t.state = 'queued' AND t.held = 0
    UNION ALL
    SELECT 'queued', coalesce(t.queued_at, t.created_at), coalesce(t.assigned_at, t.started_at) FROM tasks t
    WHERE t.state IN ('assigned', 'running')
    UNION ALL
    SELECT 'queued', coalesce(t.queued_at, t.created_at), coalesce(t.assigned_at, t.started_at, t.finished_at)
    FROM usage u CROSS JOIN tasks t ON t.id = u.task_id  -- from the window's runs to their tasks
    WHERE u.ended_at >= :since AND u.started_at < :until
      AND u.ended_at >= t.finished_at  -- its last run only (a run preempted earlier ended before it): one span a task
      AND t.state NOT IN ('queued', 'assigned', 'running')
),
edges(series, at, delta) AS (
    SELECT series, max(entered, :since), 1 FROM spans
    WHERE entered < :until AND (left_at IS NULL OR left_at > :since)
    UNION ALL
    SELECT series, left_at, -1 FROM spans
    WHERE left_at > :since AND left_at < :until AND entered < :until
)
SELECT series, CAST((at - :since) / :step AS INTEGER) AS bucket, sum(delta) AS change,
       sum(delta * (:since + (CAST((at - :since) / :step AS INTEGER) + 1) * :step - at)) AS weighted
FROM edges
GROUP BY series, bucket
ORDER BY series, bucket;

-- name: page_chart_gpus --
-- GPUs held by tasks per worker between :since and :until in buckets of :step seconds, as page_chart_tasks counts tasks: each run weighs its job's GPUs. Runs from the usage ledger (usage_ended) and the tasks that run now.
WITH spans(worker_id, gpus, entered, left_at) AS (
    SELECT u.worker_id, u.gpus, u.started_at, u.ended_at FROM usage u
    WHERE u.ended_at >= :since AND u.started_at < :until AND u.gpus > 0 AND u.worker_id IS NOT NULL
    UNION ALL
    SELECT t.worker_id, j.gpus, t.started_at, NULL
    FROM tasks t CROSS JOIN jobs j ON j.id = t.job_id  -- CROSS: from the few active tasks to their jobs, never a walk of jobs
    WHERE t.state IN ('assigned', 'running') AND t.started_at IS NOT NULL AND j.gpus > 0
),
edges(worker_id, at, delta) AS (
    SELECT worker_id, max(entered, :since), gpus FROM spans
    WHERE entered < :until AND (left_at IS NULL OR left_at > :since)
    UNION ALL
    SELECT worker_id, left_at, -gpus FROM spans
    WHERE left_at > :since AND left_at < :until AND entered < :until
)
SELECT worker_id AS series, CAST((at - :since) / :step AS INTEGER) AS bucket, sum(delta) AS change,
       sum(delta * (:since + (CAST((at - :since) / :step AS INTEGER) + 1) * :step - at)) AS weighted
FROM edges
GROUP BY worker_id, bucket
ORDER BY worker_id, bucket;

-- name: page_chart_gpu_samples --
-- Measured GPU use of workers :ids (a JSON array) between :since and :until in :buckets buckets of :step seconds (the gpu_samples table the agents' heartbeats fill): per worker and bucket, the sum over its GPUs of each GPU's last utilization sample in the bucket, in GPUs (100 % = 1). One index seek per GPU and bucket (gpu_samples (worker_id, gpu_index, at)), however often the agents sample.
WITH RECURSIVE buckets(bucket) AS (
    SELECT 0 UNION ALL SELECT bucket + 1 FROM buckets WHERE bucket + 1 < :buckets
),
gpus(worker_id, gpu_index, count) AS (
    SELECT w.id, 0, w.gpus FROM workers w WHERE w.id IN (SELECT value FROM json_each(:ids)) AND w.gpus > 0
    UNION ALL
    SELECT worker_id, gpu_index + 1, count FROM gpus WHERE gpu_index + 1 < count
)
SELECT g.worker_id AS series, b.bucket,
       sum((SELECT s.utilization_pct FROM gpu_samples s
            WHERE s.worker_id = g.worker_id AND s.gpu_index = g.gpu_index
              AND s.at >= :since + b.bucket * :step AND s.at < :since + (b.bucket + 1) * :step
            ORDER BY s.at DESC LIMIT 1)) / 100.0 AS gpus_busy
FROM gpus g, buckets b
GROUP BY g.worker_id, b.bucket
ORDER BY g.worker_id, b.bucket;

-- name: page_latest_gpu_samples --
-- Each GPU's latest sample of the :window seconds before :now (gpu_samples): utilization and memory, per worker and GPU index.
SELECT worker_id, gpu_index, max(at) AS at, utilization_pct, memory_used_mb, memory_total_mb
FROM gpu_samples
WHERE at >= :now - :window AND at <= :now
GROUP BY worker_id, gpu_index;

-- name: page_has_table --
-- Whether the state file has table :table (gpu_samples comes with schema version 18).
SELECT count(*) AS found FROM sqlite_master WHERE type = 'table' AND name = :table;

-- name: page_worker_names --
-- The names and GPUs of workers :ids (a JSON array), for the titles of the pictures.
SELECT w.id AS worker_id, w.name, w.gpus FROM workers w WHERE w.id IN (SELECT value FROM json_each(:ids));

-- name: page_gpu_workers --
-- Attached workers (not gone) that have GPUs, at most :limit, by id: the pictures' GPU charts fill up with these.
SELECT id AS worker_id FROM workers WHERE state <> 'gone' AND gpus > 0 ORDER BY id LIMIT :limit;

-- name: page_job_array --
-- The elements of array job :job_id by the state of each element's latest attempt, with their index ranges (runs of consecutive indices), at most :limit ranges.
WITH latest AS (
    -- the bare column `state` comes from the row of max(attempt) (SQLite's min/max rule)
    SELECT "index", state, max(attempt) AS attempt FROM tasks WHERE job_id = :job_id GROUP BY "index"
),
runs AS (
    SELECT state, "index", "index" - row_number() OVER (PARTITION BY state ORDER BY "index") AS island FROM latest
)
SELECT state, min("index") AS first_index, max("index") AS last_index, count(*) AS elements,
       sum(count(*)) OVER (PARTITION BY state) AS in_state,
       count(*) OVER (PARTITION BY state) AS ranges
FROM runs
GROUP BY state, island
ORDER BY state, first_index
LIMIT :limit;

-- name: page_job_counts --
-- How many tasks (every attempt), events and log lines job :job_id has, each counted up to :cap.
SELECT (SELECT count(*) FROM (SELECT 1 FROM tasks WHERE job_id = :job_id LIMIT :cap)) AS tasks,
       (SELECT count(*) FROM (SELECT 1 FROM events WHERE job_id = :job_id LIMIT :cap)) AS events,
       (SELECT count(*) FROM (SELECT 1 FROM logs WHERE job_id = :job_id LIMIT :cap)) AS logs;

-- name: page_job_marks --
-- What happened to job :job_id's tasks that a timeline marks (restarts, preemptions, requeues, losses, retries, holds), in order, at most :limit.
SELECT e.seq, e.at, e.kind, e.task_id, e.data
FROM events e
WHERE e.job_id = :job_id
  AND e.kind IN ('task_preempted', 'task_requeued', 'task_lost', 'job_retried', 'element_retried', 'job_held',
                 'job_released', 'task_reported')
  AND (e.kind <> 'task_reported' OR json_extract(e.data, '$.restarts') > 0)  -- a report that counts a restart
ORDER BY e.seq
LIMIT :limit;


-- name: page_worker --
-- Worker :worker_id whatever its state: what it has, uses and has free, its cordon, and how it isolates tasks.
SELECT w.id AS worker_id, w.name, w.state, w.gone_reason, w.labels, w.advertise_address, w.version, w.isolation,
       w.gpu_models, w.registered_at, w.last_seen_at, w.lease_expires_at,
       l.slots, l.active_tasks, l.free_slots, l.gpus, l.free_gpus, l.unhealthy_gpus,
       l.cpus, l.free_cpus, l.memory_mb, l.free_memory_mb,
       c.state AS cordon, c.reason AS cordon_reason, c.since AS cordon_since, c.deadline AS drain_deadline,
       c.drained_at
FROM workers w
JOIN worker_load l ON l.worker_id = w.id
LEFT JOIN worker_cordons c ON c.worker_id = w.id
WHERE w.id = :worker_id;

-- name: page_worker_gpus --
-- Worker :worker_id's GPUs by index: their health as its agent reports it, and each one's latest sample of the
-- :window seconds before :now (utilization, memory; NULL where none came).
WITH RECURSIVE gpus(gpu_index) AS (
    SELECT 0 WHERE (SELECT gpus FROM workers WHERE id = :worker_id) > 0
    UNION ALL
    SELECT gpu_index + 1 FROM gpus WHERE gpu_index + 1 < (SELECT gpus FROM workers WHERE id = :worker_id)
)
SELECT g.gpu_index, json_extract(w.gpu_models, '$[' || g.gpu_index || ']') AS model, h.uuid,
       coalesce(h.healthy, 1) AS healthy, h.reason, h.changed_at
FROM gpus g
JOIN workers w ON w.id = :worker_id
LEFT JOIN worker_gpus h ON h.worker_id = :worker_id AND h."index" = g.gpu_index
ORDER BY g.gpu_index;

-- name: page_worker_latest_samples --
-- Worker :worker_id's GPUs' latest samples of the :window seconds before :now (gpu_samples), by GPU index.
SELECT gpu_index, max(at) AS at, utilization_pct, memory_used_mb, memory_total_mb
FROM gpu_samples
WHERE worker_id = :worker_id AND at >= :now - :window AND at <= :now
GROUP BY gpu_index;

-- name: page_chart_worker_gpu_samples --
-- Worker :worker_id's measured GPU use between :since and :until in :buckets buckets of :step seconds: per GPU
-- and bucket, the GPU's last utilization sample in the bucket (percent; none where it sent none). One index
-- seek per GPU and bucket (gpu_samples (worker_id, gpu_index, at)).
WITH RECURSIVE buckets(bucket) AS (
    SELECT 0 UNION ALL SELECT bucket + 1 FROM buckets WHERE bucket + 1 < :buckets
),
gpus(gpu_index) AS (
    SELECT 0 WHERE (SELECT gpus FROM workers WHERE id = :worker_id) > 0
    UNION ALL
    SELECT gpu_index + 1 FROM gpus WHERE gpu_index + 1 < (SELECT gpus FROM workers WHERE id = :worker_id)
)
SELECT g.gpu_index AS series, b.bucket,
       (SELECT s.utilization_pct FROM gpu_samples s
        WHERE s.worker_id = :worker_id AND s.gpu_index = g.gpu_index
          AND s.at >= :since + b.bucket * :step AND s.at < :since + (b.bucket + 1) * :step
        ORDER BY s.at DESC LIMIT 1) AS busy_pct
FROM gpus g, buckets b
ORDER BY g.gpu_index, b.bucket;

-- name: page_worker_tasks --
-- The tasks worker :worker_id runs now (index tasks_worker_active), then the :limit it ran last, newest first
-- (read from the newest task back: as far as its last :limit go).
SELECT * FROM (
    SELECT t.id AS task_id, t.job_id, j.name AS job_name, t.attempt, t."index", t.state, t.gpu_indices,
           t.started_at, t.finished_at, t.exit_code, t.reason
    FROM tasks t INDEXED BY tasks_worker_active JOIN jobs j ON j.id = t.job_id
    WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
    ORDER BY t.id DESC)
UNION ALL
SELECT * FROM (
    SELECT t.id AS task_id, t.job_id, j.name AS job_name, t.attempt, t."index", t.state, t.gpu_indices,
           t.started_at, t.finished_at, t.exit_code, t.reason
    FROM tasks t JOIN jobs j ON j.id = t.job_id
    WHERE t.worker_id = :worker_id AND t.state NOT IN ('assigned', 'running')
    ORDER BY t.id DESC
    LIMIT :limit);
