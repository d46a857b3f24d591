-- The queries of scheduler/reservations.py: planning the reservations of EASY backfill each upkeep tick.

-- name: backfill_settings --
-- Whether backfill is on, how many reservations each group of workers holds (its highest-ranked waiting
-- jobs'), how many waiting jobs a plan looks at (Slurm's bf_max_job_test), the default run time.
SELECT backfill, backfill_depth, backfill_max_jobs, default_runtime_s FROM scheduler_settings WHERE id = 1;

-- name: plan_workers --
-- The workers a plan may reserve room on (online, not cordoned) and their free room now (worker_load).
SELECT w.id, w.name, l.free_slots, l.free_gpus, l.free_cpus, l.free_memory_mb
FROM workers w JOIN worker_load l ON l.worker_id = w.id
WHERE w.state = 'online' AND NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id);

-- name: plan_running --
-- The room each active task holds and when it frees it (task_expected_end: its start plus its job's
-- expected_s; an overrunning task's, :soon: it may end any time, never now), and the room held now for a
-- gang whose preemption victims stop (gang_reservations), freed as that gang is expected to end.
SELECT e.worker_id, max(e.expected_end_at, :soon) AS end_at, j.gpus, j.cpus, j.memory_mb
FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
JOIN workers w ON w.id = e.worker_id AND w.state = 'online'
UNION ALL
SELECT r.worker_id, :now + coalesce(m.expected_s, 3600), r.gpus, r.cpus, r.memory_mb
FROM gang_reservations r LEFT JOIN job_runtime_model m ON m.job_id = r.job_id
WHERE r.expires_at > :now;

-- name: plan_candidates --
-- The highest-ranked waiting jobs, best first, at most :max_jobs, as the claim ranks their best queued
-- task (claimable_tasks: priority with its age boost, the project's then the user's fair share, first
-- come), each with what it asks of a worker (a gang: `width` workers at once) and whether it may run at
-- all: `admitted` is 0 over its project's GPU quota with its borrowing (for every rank of a gang) or with
-- its user at the running-jobs limit, and for a job that holds room now (gang_reservations). Only
-- `queued` jobs: not held, not waiting for `--after` or `--begin` (those are 'waiting', their tasks held).
-- Reads each group's best :max_jobs tasks (task_queue_shape), not the whole queue.
WITH best AS (
    SELECT h.task_id, h.job_id, h.priority + h.aged AS rank_priority, g.shape_id, g.project_id, g.user_id,
           row_number() OVER (PARTITION BY h.job_id ORDER BY h.priority + h.aged DESC, h.task_id) AS nth
    FROM queue_groups g
    JOIN task_queue h ON h.task_id IN (
        SELECT b.task_id FROM task_queue b
        WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
        ORDER BY b.priority + b.aged DESC, b.task_id LIMIT :max_jobs)
)
SELECT j.id, j.gang, j.width, j.gpus, j.cpus, j.memory_mb, b.shape_id, m.expected_s,
       (q.nominal_left IS NULL OR q.nominal_left - j.gpus * (CASE WHEN j.gang THEN j.width - 1 ELSE 0 END)
                                  + q.borrow >= 0)
       AND NOT coalesce((SELECT u.at_limit FROM user_running_jobs u WHERE u.user_id = j.user_id), 0)
       AND NOT EXISTS (SELECT 1 FROM gang_reservations r WHERE r.job_id = j.id AND r.expires_at > :now) AS admitted
FROM best b
CROSS JOIN jobs j ON j.id = b.job_id  -- the best tasks' jobs, not every queued job (issue 41: 4.3 ms a plan at 8,000 queued, 1.4 with it)
JOIN job_runtime_model m ON m.job_id = j.id
JOIN queue_group_quota q ON q.shape_id = b.shape_id AND q.project_id = b.project_id AND q.user_id = b.user_id
WHERE b.nth = 1 AND j.state = 'queued' AND j.hold = 0
ORDER BY b.rank_priority DESC, (SELECT u.usage FROM project_fair_share u WHERE u.project_id = b.project_id),
         (SELECT u.usage FROM user_fair_share u WHERE u.project_id = b.project_id AND u.user_id = b.user_id),
         b.task_id
LIMIT :max_jobs;

-- name: plan_fits --
-- Which of the plan's workers each shape (:shape_ids, a JSON array) could ever run a task of (fits:
-- labels, accelerator, size, secrets; shape_worker_fit), online and not cordoned.
SELECT f.shape_id, f.worker_id FROM shape_worker_fit f
WHERE f.shape_id IN (SELECT value FROM json_each(:shape_ids)) AND f.fits AND f.worker_state = 'online' AND f.schedulable;

-- name: clear_reservations --
-- A plan replaces the last one whole.
DELETE FROM reservations;

-- name: insert_reservation --
-- One worker's part of a reservation.
INSERT INTO reservations (job_id, worker_id, tasks, gpus, cpus, memory_mb, start_at, planned_at, reason)
VALUES (:job_id, :worker_id, 1, :gpus, :cpus, :memory_mb, :start_at, :now, :reason);

-- name: set_claim_clock --
-- The claim's time, which the fair-share views decay usage to, and how many tasks of each group
-- claimable_tasks reads (:depth): written first in each claim's transaction (a view takes no parameter);
-- the room of every worker's reservations (worker_id NULL).
UPDATE claim_clock SET now = :now, depth = :depth, worker_id = NULL WHERE id = 1 RETURNING now;
