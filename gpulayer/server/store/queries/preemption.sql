-- The queries of scheduler/preemption.py: victims for waiting work, gang reservations.

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
WHERE (q.nominal IS NULL OR s.gpus = 0
       OR q.gpus_in_use + s.gpus * CASE WHEN s.gang = 1 THEN j.width ELSE 1 END <= q.nominal + q.borrow)
  AND (s.gang = 0 OR NOT EXISTS (SELECT 1 FROM gang_reservations r
                                 WHERE r.job_id = h.job_id AND r.expires_at > :now))
  -- a gang whose ranks must share a label's value (`same`) waits for room, never preempts: the plan's
  -- workers would be any that fit, not those of one value
  AND (s.gang = 0 OR coalesce(json_array_length(j.spec, '$.same'), 0) = 0)
  AND NOT coalesce((SELECT u.at_limit FROM user_running_jobs u WHERE u.user_id = g.user_id), 0)
  AND NOT EXISTS (SELECT 1 FROM preemptions pe JOIN tasks v ON v.id = pe.task_id
                  WHERE pe.for_task_id = h.task_id AND pe.done_at IS NULL AND v.state IN ('assigned', 'running'))
ORDER BY h.priority + h.aged DESC, h.task_id
LIMIT :limit;

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
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL, ahead = 0,
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
