-- Idle GPUs taken back (scheduler/idle.py; docs/workers.md "Idle GPUs").

-- name: idle_tasks --
-- Running tasks whose every held GPU was under its threshold for its whole idle timeout, each with its
-- policy (the job's JobSpec idle_*, else its project's, else the fleet's :fleet_* ones), whether a shell or
-- SSH session is open on it (interactive: warned first), when it was last warned in this idle stretch, and
-- the samples that justify it (`gpus`: a JSON array, per GPU its count, first and last `at`, peak and mean
-- utilisation and its series [[at, pct], ...]). Gaps in the samples are not idleness: every GPU needs a
-- sample within :gap_s of the window's start and of :now, and none more than :gap_s after the one before;
-- a sample with no utilisation (NVML could not tell) counts as busy. A task acted on already in this
-- assignment (idle_reclaims: notify, requeue, cancel) is not found again; :limit tasks at most.
WITH policy AS (
    SELECT t.id AS task_id, t.job_id, t.worker_id, t."index", t.attempt, t.gpu_indices, t.assigned_at,
           t.started_at, j.user_id, j.project_id, j.array_size, j.gang, j.width,
           coalesce(json_extract(j.spec, '$.idle_timeout_seconds'), p.idle_timeout_s, :fleet_timeout_s) AS timeout_s,
           coalesce(json_extract(j.spec, '$.idle_below_pct'), p.idle_below_pct, :fleet_below_pct) AS below_pct,
           coalesce(json_extract(j.spec, '$.idle_action'), p.idle_action, :fleet_action) AS action
    FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN projects p ON p.id = j.project_id
    WHERE t.state = 'running' AND t.cancel_requested = 0 AND t.gpu_indices <> '[]'
),
due AS (
    SELECT d.* FROM policy d
    WHERE d.timeout_s IS NOT NULL AND d.started_at <= :now - d.timeout_s
      AND NOT EXISTS (SELECT 1 FROM idle_reclaims r WHERE r.task_id = d.task_id AND r.assigned_at = d.assigned_at
                                                     AND r.action <> 'warn')
      -- cheap first: a GPU whose newest sample is busy (or unknown) rules the task out with one index seek,
      -- so only tasks idle now have their window read
      AND NOT EXISTS (SELECT 1 FROM json_each(d.gpu_indices) g
                      WHERE coalesce((SELECT s.utilization_pct FROM gpu_samples s INDEXED BY gpu_samples_gpu
                                      WHERE s.worker_id = d.worker_id AND s.gpu_index = CAST(g.value AS INTEGER)
                                      ORDER BY s.at DESC LIMIT 1), 1e9) >= d.below_pct)
),
held AS (
    SELECT d.task_id, d.worker_id, d.timeout_s, CAST(g.value AS INTEGER) AS gpu_index
    FROM due d, json_each(d.gpu_indices) g
),
seen AS (
    SELECT h.task_id, h.gpu_index, s.at, s.utilization_pct,
           s.at - lag(s.at) OVER (PARTITION BY h.task_id, h.gpu_index ORDER BY s.at) AS gap
    FROM held h JOIN gpu_samples s INDEXED BY gpu_samples_gpu
      ON s.worker_id = h.worker_id AND s.gpu_index = h.gpu_index AND s.at > :now - h.timeout_s AND s.at <= :now
),
per_gpu AS (
    SELECT task_id, gpu_index, count(*) AS n, min(at) AS first_at, max(at) AS last_at,
           coalesce(max(gap), 0) AS max_gap, max(coalesce(utilization_pct, 1e9)) AS peak,
           avg(utilization_pct) AS mean,
           json_group_array(json_array(round(at, 3), utilization_pct)) AS series
    FROM (SELECT * FROM seen ORDER BY task_id, gpu_index, at)
    GROUP BY task_id, gpu_index
)
SELECT d.task_id, d.job_id, d.worker_id, d."index", d.attempt, d.assigned_at, d.user_id, d.project_id,
       d.array_size, d.gang, d.width, d.timeout_s, d.below_pct, d.action,
       EXISTS (SELECT 1 FROM sessions se WHERE se.task_id = d.task_id AND se.closed_at IS NULL) AS interactive,
       (SELECT max(r.at) FROM idle_reclaims r WHERE r.task_id = d.task_id AND r.assigned_at = d.assigned_at
                                               AND r.action = 'warn' AND r.at >= :now - d.timeout_s - :warning_s)
           AS warned_at,
       json_group_array(json_object('index', g.gpu_index, 'samples', g.n, 'from', round(g.first_at, 3),
                                    'to', round(g.last_at, 3), 'peak_pct', g.peak, 'mean_pct', round(g.mean, 3),
                                    'series', json(g.series))) AS gpus
FROM due d JOIN per_gpu g ON g.task_id = d.task_id
GROUP BY d.task_id
HAVING count(*) = json_array_length(d.gpu_indices) AND max(g.peak) < d.below_pct
   AND max(g.first_at) <= :now - d.timeout_s + :gap_s AND min(g.last_at) >= :now - :gap_s
   AND max(g.max_gap) <= :gap_s
ORDER BY d.task_id
LIMIT :limit;

-- name: idle_task_unchanged --
-- An idle task found on a reader, as the writer sees it now: still running, same assignment, not stopping,
-- not acted on meanwhile (NULL row otherwise).
SELECT t.id FROM tasks t
WHERE t.id = :task_id AND t.state = 'running' AND t.assigned_at = :assigned_at AND t.cancel_requested = 0
  AND NOT EXISTS (SELECT 1 FROM idle_reclaims r WHERE r.task_id = t.id AND r.assigned_at = t.assigned_at
                                                 AND r.action <> 'warn');

-- name: insert_idle_reclaim --
-- What the idle check did to a task's assignment (warn, notify, requeue, cancel).
INSERT INTO idle_reclaims (task_id, job_id, assigned_at, action, at)
VALUES (:task_id, :job_id, :assigned_at, :action, :now);

-- name: request_idle_preemption --
-- An idle task asked to stop and go back to the queue, as preemption does (preemption.requeue finishes it
-- when its worker reports the stop): for_task_id / for_job_id its own, reason 'idle'.
INSERT INTO preemptions (task_id, job_id, worker_id, for_task_id, for_job_id, reason, asked_at)
SELECT t.id, t.job_id, t.worker_id, t.id, t.job_id, 'idle', :now
FROM tasks t
WHERE t.id = :task_id AND t.state IN ('assigned', 'running') AND t.cancel_requested = 0
RETURNING task_id, job_id, worker_id;

-- name: idle_policy_possible --
-- Whether any idle policy could apply: a project's, or a running GPU task's job's own (the fleet's is known
-- to the caller). The idle check ends after this one read when none.
SELECT EXISTS (SELECT 1 FROM projects WHERE idle_timeout_s IS NOT NULL)
    OR EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.id = t.job_id
               WHERE t.state = 'running' AND t.gpu_indices <> '[]'
                 AND json_extract(j.spec, '$.idle_timeout_seconds') IS NOT NULL) AS possible;
