-- The queries of scheduler/ledger.py: the usage ledger and fair share.

-- name: insert_usage --
-- The usage ledger: a row for each run of the tasks :task_ids (a JSON list) that goes back to
-- the queue now (:outcome preempted or requeued), before the requeue clears its start (a task
-- never started ran nothing: no row). Runs that end are written by the trigger tasks_run_ended.
-- Returns what fair share is charged (charge_fairshare).
INSERT INTO usage (task_id, job_id, attempt, job_name, labels, user_id, project_id, worker_id, worker_name,
                   gpus, cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome, preempted_by)
SELECT t.id, t.job_id, t.attempt, j.name, j.labels, j.user_id, j.project_id, t.worker_id, w.name,
       j.gpus, j.cpus, t.started_at, max(:now, t.started_at),
       (j.gpus + t.gpu_share) * max(:now - t.started_at, 0), j.cpus * max(:now - t.started_at, 0),
       :outcome, :preempted_by
FROM json_each(:task_ids) k
JOIN tasks t ON t.id = k.value
JOIN jobs j ON j.id = t.job_id
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.started_at IS NOT NULL
RETURNING project_id, user_id, CASE WHEN gpu_seconds > 0 THEN gpu_seconds ELSE cpu_seconds END AS charge;

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
-- (either may match); a page: at most :limit rows (-1: all) after the first :offset. A removed project's
-- runs keep the name it had (project_name), not whatever project later got its id. The label is bound,
-- never made into a JSON path: any key is only data.
SELECT CASE :by WHEN 'user' THEN coalesce(us.name, '#' || u.user_id)
                WHEN 'project' THEN coalesce(u.project_name, pr.name, '#' || u.project_id)
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

-- name: managed_projects --
-- The projects a user manages (their usage is theirs to read).
SELECT project_id FROM memberships WHERE user_id = :user_id AND role = 'manager' ORDER BY project_id;

-- name: clear_fairshare_running --
-- Fair share's running part is rewritten whole (set_fairshare_running): first every row to 0.
UPDATE fairshare SET running = 0 WHERE running > 0;

-- name: set_fairshare_running --
-- Fair share's view of the runs still going: each (project, user)'s GPU-seconds (CPU-seconds
-- without GPUs; a GPU's share, its part) so far, from the running tasks (the partial index tasks_lease); upkeep writes it
-- every few seconds, so a project's long runs weigh while they run, not only once they end.
INSERT INTO fairshare (project_id, user_id, usage, updated_at, running)
SELECT j.project_id, j.user_id, 0, :now,
       sum(CASE WHEN j.gpus + t.gpu_share > 0 THEN j.gpus + t.gpu_share ELSE j.cpus END * max(:now - t.started_at, 0))
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state IN ('assigned', 'running') AND t.state = 'running' AND t.started_at IS NOT NULL
GROUP BY j.project_id, j.user_id
ON CONFLICT (project_id, user_id) DO UPDATE SET running = excluded.running;
