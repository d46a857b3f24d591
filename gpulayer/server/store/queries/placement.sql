-- The queries of scheduler/placement.py: acquisition, gang placement, GPU indices, assignments.

-- name: assigned_task_for_worker --
-- acquire is idempotent until start: the assigned tasks not started yet (oldest first, at
-- most :limit) are handed out again; not those leased ahead (scheduler/chunks.py), which the
-- worker starts when it has room.
-- (The redundant IN term lets SQLite use the partial index tasks_worker_active;
-- without it this scans every task the worker ever ran: 7 ms at 100k tasks.)
SELECT id FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND state = 'assigned'
  AND cancel_requested = 0 AND ahead = 0
ORDER BY id LIMIT :limit;

-- name: nothing_for_worker --
-- An acquire's read before its write: 1 when nothing is queued at all and nothing is assigned to the
-- worker and not started (its own held again, or leased ahead), so the claim would find nothing and its
-- writer transaction is skipped (an idle fleet's acquires cost a read each: docs/benchmarks/issue-25.md, "Where each target stands").
SELECT NOT EXISTS (SELECT 1 FROM shapes WHERE queued > 0)
   AND NOT EXISTS (SELECT 1 FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running')
                   AND state = 'assigned') AS idle;

-- name: set_claim_worker --
-- The claim's time and depth (as reservations.sql's set_claim_clock) and its worker: claimable_tasks
-- reads the room of :worker_id's reservations only (once a claim; schema 29), so the views are read for
-- that worker only until the clock is set again.
UPDATE claim_clock SET now = :now, depth = :depth, worker_id = :worker_id WHERE id = 1 RETURNING now;

-- name: worker_free --
-- What an online worker has free now (worker_load), with what acquisition hands on.
SELECT l.worker_id AS id, l.gpus, l.free_slots, w.advertise_address, w.gpu_sharing
FROM worker_load l JOIN workers w ON w.id = l.worker_id
WHERE l.worker_id = CAST(:worker_id AS INTEGER) AND l.state = 'online';

-- name: acquire_task --
-- Claim up to :max queued tasks the worker may take now, in one statement, and nothing else: exactly
-- the tasks, in the order, that as many one-task claims in a row (acquire_one) would take, or the first
-- of them (claimable_batch says which it can be sure of; placement claims again when fewer came back),
-- read at a claim_clock.depth of :max + 1.
-- RETURNING gives each task's place in the ranking (`k`): placement sorts by it to reserve GPU indices
-- in claim order (RETURNING's order is SQLite's). Gang (multi-node) jobs are placed by gang_workers /
-- assign_task.
-- (UPDATE ... FROM, not WHERE id IN: SQLite pushes the worker_id down into the views from here, not from IN.)
WITH claim AS MATERIALIZED (
    SELECT task_id, k FROM claimable_batch WHERE worker_id = CAST(:worker_id AS INTEGER) AND sure AND k <= :max
)
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
FROM claim WHERE tasks.id = claim.task_id
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus,
          (SELECT array_size FROM jobs WHERE jobs.id = tasks.job_id) AS array_size,
          (SELECT c.k FROM claim c WHERE c.task_id = tasks.id) AS k;

-- name: mark_jobs_running --
-- Jobs leave the queue when their first task is assigned (:job_ids, a JSON array).
UPDATE jobs SET state = 'running' WHERE id IN (SELECT value FROM json_each(:job_ids)) AND state = 'queued';

-- name: acquire_one --
-- Claim the best queued task that the worker may take now, and nothing else: the first eligible task of
-- claimable_tasks (what fits the worker and its room, admission, the ranking: schema.sql), read at a
-- claim_clock.depth of 1. One task: the claim of acquire and of a `max_tasks` of 1 (and while a gang
-- waits); acquire_task claims several. Gang (multi-node) jobs are placed by gang_workers / assign_task.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id = (SELECT task_id FROM claimable_tasks WHERE worker_id = CAST(:worker_id AS INTEGER) AND eligible
            ORDER BY pos LIMIT 1)
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

-- name: worker_gpu_topology --
-- How the worker's GPUs are wired, as it reported at register (docs/workers.md, "Topology").
SELECT gpu_topology FROM workers WHERE id = :worker_id;

-- name: task_nvlink_sets --
-- For a task whose job requires GPUs joined by NVLink (`gpu_link`), the NVLink set of each of the worker's GPUs
-- (workers.gpu_nvlink, by index; null: none); no row otherwise.
SELECT w.gpu_nvlink FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN workers w ON w.id = :worker_id
WHERE t.id = :task_id AND j.gpu_link IS NOT NULL;

-- name: task_model_indices --
-- For a task whose job asks for a `gpu_model` that the worker meets by its GPUs (not by a
-- worker label; shape_worker_fit), the worker's indices of that model; no row otherwise.
SELECT m.key AS i FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN workers w ON w.id = :worker_id,
     json_each(w.gpu_models) m
WHERE t.id = :task_id AND json_extract(j.labels, '$.gpu_model') IS NOT NULL
  AND json_extract(j.labels, '$.gpu_model') IS NOT json_extract(w.labels, '$.gpu_model')
  AND m.value = json_extract(j.labels, '$.gpu_model');

-- name: set_gpu_indices --
-- Reserve device indices for an assigned task (and a fractional task's share of its GPU, else 0).
UPDATE tasks SET gpu_indices = :gpu_indices, gpu_share = :gpu_share WHERE id = :task_id AND state = 'assigned'
RETURNING id;

-- name: task_gpu_share --
-- A fractional task's share of one of the worker's GPUs (shape_worker_fit.gpu_share); no row for a task of
-- whole GPUs.
SELECT f.gpu_share FROM tasks t JOIN job_shape js ON js.job_id = t.job_id
JOIN shapes s ON s.id = js.shape_id AND (s.gpu_fraction > 0 OR s.gpu_memory_mb > 0)
JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
WHERE t.id = :task_id;

-- name: job_asks_share --
-- Whether a job asks for a share of one GPU (gpu_fraction or gpu_memory_mb): only then is task_gpu_share read.
SELECT gpu_fraction IS NOT NULL OR gpu_memory_mb IS NOT NULL AS asks FROM jobs WHERE id = :job_id;

-- name: gpu_shares_in_use --
-- The worker's GPUs that fractional tasks hold, with the shares held on each (best fit reads them).
SELECT x.value AS i, sum(t.gpu_share) AS used FROM tasks t, json_each(t.gpu_indices) x
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running') AND t.gpu_share > 0
  AND NOT EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = :worker_id AND g."index" = x.value AND g.healthy = 0)
GROUP BY x.value;

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
  AND NOT coalesce((SELECT u.at_limit FROM user_running_jobs u WHERE u.user_id = j.user_id), 0)
ORDER BY j.priority + (SELECT coalesce(max(q.aged), 0) FROM tasks t JOIN task_queue q ON q.task_id = t.id
                       WHERE t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
                         AND t.state = 'queued') DESC,
         (SELECT u.usage FROM project_fair_share u WHERE u.project_id = j.project_id),
         j.id
LIMIT :limit;

-- name: gang_workers --
-- Distinct workers that fit one rank of :job_id now and hold no room for another waiting gang
-- (gang_reservations: another gang skips such a worker whole, while single tasks may take
-- what is beyond the room held), nor GPUs a reservation of another job needs at its start that the rank
-- would still hold then (EASY backfill, as claimable_tasks judges a single task: the rank is expected to
-- end by the reservation's start, or the worker's GPUs then cover both); the polling worker first, then
-- those holding room for this job (gang_reservations, reservations), then those left with the fewest
-- free GPUs. A job with `same` label keys (docs/workers.md, "Topology"): only workers that carry each with the
-- polling worker's value (the gang's first rank is the polling worker's: whichever value it has).
SELECT f.worker_id
FROM job_worker_fit f
WHERE f.job_id = CAST(:job_id AS INTEGER) AND f.fits_now
  AND NOT EXISTS (SELECT 1 FROM jobs sj, json_each(sj.spec, '$.same') k
                  WHERE sj.id = f.job_id
                    AND NOT EXISTS (SELECT 1 FROM workers a, json_each(a.labels) al, workers b, json_each(b.labels) bl
                                    WHERE a.id = f.worker_id AND b.id = CAST(:worker_id AS INTEGER)
                                      AND al.key = k.value AND bl.key = k.value AND al.value = bl.value))
  AND NOT EXISTS (SELECT 1 FROM gang_reservations r
                  WHERE r.worker_id = f.worker_id AND r.job_id <> f.job_id AND r.expires_at > :now)
  AND NOT EXISTS (SELECT 1 FROM reservation_room r JOIN jobs j ON j.id = f.job_id
                  WHERE r.worker_id = f.worker_id AND r.job_id <> f.job_id AND f.spare_gpus + r.gain_gpus < 0
                    AND (NOT coalesce(json_extract(j.spec, '$.backfill'), 1)
                         OR :now + (SELECT m.expected_s FROM job_runtime_model m WHERE m.job_id = j.id) > r.start_at))
ORDER BY f.worker_id = :worker_id DESC,
         EXISTS (SELECT 1 FROM gang_reservations r WHERE r.worker_id = f.worker_id AND r.job_id = f.job_id) DESC,
         EXISTS (SELECT 1 FROM reservations r WHERE r.worker_id = f.worker_id AND r.job_id = f.job_id) DESC,
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
-- Everything a worker needs to run a task: the spec of the revision it runs (a service's rolling update
-- runs a replica of the new revision, service_updates.spec, beside those of the one the job serves).
SELECT t.id AS task_id, t.job_id, t.attempt, t."index", t.gpu_indices, t.gpu_share, j.width, j.gang, j.array_size,
       CASE WHEN t.revision = j.revision THEN j.spec
            ELSE coalesce((SELECT u.spec FROM service_updates u WHERE u.job_id = t.job_id AND u.revision = t.revision),
                          j.spec) END AS spec
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.id = :task_id;

-- name: task_was_preempted --
-- Was this task stopped for a preemption before (its next run gets GPULAYER_PREEMPTED=1)?
SELECT 1 AS found FROM preemptions WHERE task_id = :task_id AND done_at IS NOT NULL LIMIT 1;

-- name: task_log_base --
-- The number a task's next log line gets (its Assignment's log_base): after those already stored.
SELECT coalesce(max(n) + 1, 0) AS n FROM logs WHERE task_id = :task_id;
