-- The queries of scheduler/core.py: the scheduler's start (cascades left undone, settings).

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

-- name: set_scheduler_settings --
-- The control plane's settings, written at start for the SQL that reads them.
UPDATE scheduler_settings SET fairshare_half_life_s = :half_life_s, preempt_grace_s = :preempt_grace_s,
    backfill = :backfill, backfill_depth = :backfill_depth, backfill_max_jobs = :backfill_max_jobs,
    default_runtime_s = :default_runtime_s
WHERE id = 1;
