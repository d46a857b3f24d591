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

-- name: set_claim_clock --
-- The claim's time, which the fair-share views decay usage to: written first in each claim's
-- transaction (a view takes no parameter).
UPDATE claim_clock SET now = :now WHERE id = 1 RETURNING now;

-- name: worker_free --
-- What an online worker has free now (worker_load), with what acquisition hands on.
SELECT l.worker_id AS id, l.gpus, l.free_slots, w.advertise_address
FROM worker_load l JOIN workers w ON w.id = l.worker_id
WHERE l.worker_id = CAST(:worker_id AS INTEGER) AND l.state = 'online';

-- name: acquire_task --
-- Claim up to :max queued tasks the worker may take now, in one statement, and nothing else:
-- exactly the tasks, in the order, that as many one-task claims in a row (acquire_one) would take,
-- each judged by the room, quota use and running jobs the claims before it left; or the first of
-- them. What fits the worker and what its room holds (shape_worker_fit.fits_now), what admission
-- allows (queue_group_quota, user_running_jobs) and the order are read as acquire_one reads them,
-- group by group of queued work (queue_groups: shape, project, user), never task by task, so
-- queued tasks the worker cannot take cost nothing. Each admitted group offers its best :max + 1
-- tasks of jobs the worker holds none of (an array's elements may share a worker, a job's other
-- replicas may not); they are ranked as acquire_one ranks groups (priority with its age boost, the
-- project's then the user's fair-share usage, first come), and running sums down the ranking stand
-- for the claims before each row: the worker's slots, GPUs, CPUs and memory (less the room held
-- for a waiting gang, gang_reservations), the project's GPUs against `nominal_left` (and `borrow`),
-- the user's added jobs against the running-jobs limit. The claim keeps the ranking's first
-- candidate (acquire_one's choice), then those before the first row it cannot be sure of: one
-- whose sums no longer fit, a task that picks GPU indices by model or whole GPUs beside MIG
-- instances (only as the first: its room is no sum), a group that may borrow only once another
-- project leaves its nominal quota (it could become the better choice), and past a group's last
-- row read (its rest was not). Sums count every row before, so a row that does not fit stops the
-- rows after it that might: conservative, never more; placement.acquire_many claims again when
-- fewer than :max came back. A task that other candidates never change (a job's other replica
-- once the worker holds the job; a group whose best task adds a job while its user is at the
-- limit) is passed over, as acquire_one passes it over. An array's %N cap needs no sum (its held
-- elements are not in task_queue). RETURNING gives each task's place in that order (`k`):
-- placement sorts by it to reserve GPU indices in claim order. Fair share is read from its views
-- (project_fair_share, user_fair_share), decayed to the claim's time (set_claim_clock).
-- Gang (multi-node) jobs are placed by gang_workers / assign_task.
WITH RECURSIVE
room AS MATERIALIZED (  -- the worker's free room now, less what is held for a waiting gang
    SELECT l.free_slots - r.n AS slots, l.free_gpus - r.gpus AS gpus, l.free_cpus - r.cpus AS cpus,
           l.free_memory_mb - r.memory_mb AS memory_mb, json_extract(l.labels, '$.gpu_model') AS gpu_model,
           EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = l.worker_id AND g.uuid GLOB 'MIG-*') AS mig
    FROM worker_load l,
         (SELECT count(*) AS n, total(gpus) AS gpus, total(cpus) AS cpus, total(memory_mb) AS memory_mb
          FROM gang_reservations WHERE worker_id = CAST(:worker_id AS INTEGER) AND expires_at > :now) r
    WHERE l.worker_id = CAST(:worker_id AS INTEGER)
),
fit AS MATERIALIZED (  -- the groups of queued work the worker could take a task of now
    SELECT q.shape_id, q.project_id, q.user_id, q.gpus, q.borrow, q.nominal_left, s.cpus, s.memory_mb,
           (s.gpus > 1 AND m.mig)
           OR (s.gpus > 0 AND json_extract(s.labels, '$.gpu_model') IS NOT NULL
               AND json_extract(s.labels, '$.gpu_model') IS NOT m.gpu_model) AS by_index,
           (SELECT u.usage FROM project_fair_share u WHERE u.project_id = q.project_id) AS project_usage,
           (SELECT u.usage FROM user_fair_share u WHERE u.project_id = q.project_id AND u.user_id = q.user_id)
           AS user_usage,
           (SELECT u.max_running_jobs - u.running_jobs FROM user_running_jobs u WHERE u.user_id = q.user_id)
           AS user_left
    FROM shapes s INDEXED BY shapes_queued
    JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
    CROSS JOIN queue_group_quota q ON q.shape_id = s.id
    CROSS JOIN room m
    WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now
      AND m.slots >= 1 AND m.gpus >= s.gpus AND m.cpus >= s.cpus AND m.memory_mb >= s.memory_mb
),
admitted AS MATERIALIZED (  -- within the nominal quota, or borrowing; `contested`: another project's fitting group is within its own
    SELECT g.*, EXISTS (SELECT 1 FROM fit o WHERE o.project_id <> g.project_id AND o.nominal_left >= 0) AS contested
    FROM fit g
    WHERE g.nominal_left IS NULL OR g.nominal_left >= 0 OR g.nominal_left + g.borrow >= 0
),
-- Each group's best :max + 1 tasks of jobs the worker holds none of (or of an array), walked down
-- task_queue_shape one seek a row from a row before the first (i = -1, which the join on jobs
-- below drops); the last of :max + 1 says that the group's rest was not read.
offered (shape_id, project_id, user_id, i, task_id, job_id, rank_priority) AS (
    SELECT g.shape_id, g.project_id, g.user_id, -1, 0, NULL, 1000000000000000000 FROM admitted g  -- before the first
    UNION ALL
    SELECT w.shape_id, w.project_id, w.user_id, w.i + 1, h.task_id, h.job_id, h.priority + h.aged
    FROM offered w
    JOIN task_queue h ON h.task_id = (  -- the group's next, after w (the worker's jobs skipped, not an array's)
        SELECT b.task_id FROM task_queue b
        WHERE (b.shape_id, b.project_id, b.user_id) = (w.shape_id, w.project_id, w.user_id)
          AND (b.priority + b.aged < w.rank_priority OR (b.priority + b.aged = w.rank_priority AND b.task_id > w.task_id))
          AND ((SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL
               OR NOT EXISTS (SELECT 1 FROM tasks o WHERE o.worker_id = CAST(:worker_id AS INTEGER)
                                                     AND +o.job_id = b.job_id AND o.state IN ('assigned', 'running')))
        ORDER BY b.priority + b.aged DESC, b.task_id LIMIT 1)
    WHERE w.i < :max
),
-- The ranking, written once: `pos`, each offered task's place in claim order (acquire_one's): priority
-- with its age boost, highest first; fair share, the project's then the user's, lowest first; first come.
ordered AS MATERIALIZED (
    SELECT g.*, o.i, o.task_id, o.job_id, NOT (j.state = 'running' AND j.array_size IS NULL) AS adds_job,
           j.array_size IS NULL AS single,
           row_number() OVER (ORDER BY o.rank_priority DESC, g.project_usage, g.user_usage, o.task_id) AS pos
    FROM offered o
    CROSS JOIN admitted g ON g.shape_id = o.shape_id AND g.project_id = o.project_id AND g.user_id = o.user_id
    CROSS JOIN jobs j ON j.id = o.job_id
),
ranked AS MATERIALIZED (  -- each row's flags (0 or 1, never NULL)
    SELECT o.*,                                                              -- adds_job: counts against the user's limit
           coalesce(o.nominal_left < 0 AND o.contested, 0) AS blocked,       -- may borrow once uncontested
           o.i = :max AS unread_after,                                       -- the group's next tasks were not read
           -- a job's other replicas: its first one claimed, the worker holds it
           o.single AND row_number() OVER (PARTITION BY o.job_id ORDER BY o.pos) > 1 AS replica,
           -- a group whose best task adds a job while its user is at the limit offers nothing from there on
           max(o.adds_job AND coalesce(o.user_left <= 0, 0))
               OVER (PARTITION BY o.shape_id, o.project_id, o.user_id ORDER BY o.pos) AS dead
    FROM ordered o
),
sums AS MATERIALIZED (  -- what the candidates up to each row (itself included) ask, in claim order
    SELECT c.*,
           sum(c.candidate) OVER w AS k,
           sum(c.candidate * c.gpus) OVER w AS sum_gpus,
           sum(c.candidate * c.cpus) OVER w AS sum_cpus,
           sum(c.candidate * c.memory_mb) OVER w AS sum_memory_mb,
           coalesce(sum(c.candidate * c.gpus) OVER (PARTITION BY c.project_id ORDER BY c.pos
                                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
           AS project_gpus_before,
           coalesce(sum(c.candidate * c.adds_job) OVER (PARTITION BY c.user_id ORDER BY c.pos
                                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
           AS jobs_before
    FROM (SELECT r.*, NOT r.replica AND NOT r.dead AND NOT r.blocked AS candidate FROM ranked r) c
    WINDOW w AS (ORDER BY c.pos ROWS UNBOUNDED PRECEDING)
),
-- `misfit`: a candidate the claims before it leave no sure room for. The ranking stops at a misfit
-- or a blocked group's row (stop_here), and after a group's row that was read last (stop_after).
stops AS MATERIALIZED (
    SELECT j.*, coalesce(sum(j.stop_here OR j.stop_after)
                         OVER (ORDER BY j.pos ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS stops_before
    FROM (SELECT s.*, (s.blocked AND NOT s.dead) OR (s.candidate AND (
                          s.k > m.slots OR s.sum_gpus > m.gpus OR s.sum_cpus > m.cpus OR s.sum_memory_mb > m.memory_mb
                          OR (s.k > 1 AND s.by_index)
                          OR CASE WHEN s.nominal_left IS NULL OR s.nominal_left - s.project_gpus_before >= 0 THEN 0
                                  WHEN s.contested THEN 1
                                  ELSE s.nominal_left - s.project_gpus_before + s.borrow < 0 END
                          OR (s.adds_job AND coalesce(s.user_left - s.jobs_before <= 0, 0)))) AS stop_here,
                 s.unread_after AND NOT s.dead AS stop_after
          FROM sums s, room m) j
),
claim AS MATERIALIZED (
    SELECT c.task_id, c.k FROM stops c
    WHERE c.candidate AND c.k <= :max AND (c.k = 1 OR (c.stops_before = 0 AND NOT c.stop_here))
)
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id IN (SELECT task_id FROM claim)
-- `k`: the task's place in the claim's order (placement sorts by it: RETURNING's order is SQLite's).
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus,
          (SELECT array_size FROM jobs WHERE jobs.id = tasks.job_id) AS array_size,
          (SELECT c.k FROM claim c WHERE c.task_id = tasks.id) AS k;

-- name: mark_jobs_running --
-- Jobs leave the queue when their first task is assigned (:job_ids, a JSON array).
UPDATE jobs SET state = 'running' WHERE id IN (SELECT value FROM json_each(:job_ids)) AND state = 'queued';

-- name: acquire_one --
-- Claim the best queued task that the worker may take now, and nothing else: what fits it and
-- what its room holds (shape_worker_fit.fits_now), what admission allows (queue_group_quota,
-- user_running_jobs) and the order are read from views, group by group of queued work
-- (queue_groups: shape, project, user), never task by task, so queued tasks the worker cannot
-- take cost nothing. One task: the claim of acquire and of a `max_tasks` of 1 (and while a gang
-- waits); acquire_task below claims several in one statement, its first row always this one's.
-- A group is admitted within its project's nominal quota, or borrowing up to `borrow` beyond it
-- while no other project's group the worker could take is within its own; the room held on the
-- worker for a waiting gang (gang_reservations, while its preemption victims stop) is not taken,
-- only what is beyond it. Each group offers its best task of a job the worker holds none of
-- (an array's elements may share a worker), in task_queue_shape's order: priority with its age
-- boost (upkeep's age_queued_tasks), first come. A task that adds a job (not a running job's
-- queued replica; an array's element does) waits while its user is at the running-jobs limit.
-- Best: priority, then fair share (project_fair_share, then user_fair_share: decayed to the
-- claim's time, set_claim_clock), then first come. Held tasks (a waiting job's, an array's past its %N
-- cap) are not in task_queue. Gang (multi-node) jobs are placed by gang_workers / assign_task;
-- job_quota_reason says what of admission holds a job back.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id = (
    WITH fit AS MATERIALIZED (  -- the groups of queued work the worker could take a task of now
        SELECT q.* FROM shapes s INDEXED BY shapes_queued
        JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
        CROSS JOIN queue_group_quota q ON q.shape_id = s.id
        WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now
          AND (NOT EXISTS (SELECT 1 FROM gang_reservations r
                           WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now)
               OR (SELECT l.free_slots - count(*) >= 1 AND l.free_gpus - total(r.gpus) >= s.gpus
                          AND l.free_cpus - total(r.cpus) >= s.cpus
                          AND l.free_memory_mb - total(r.memory_mb) >= s.memory_mb
                   FROM gang_reservations r, worker_load l
                   WHERE r.worker_id = CAST(:worker_id AS INTEGER) AND r.expires_at > :now
                     AND l.worker_id = CAST(:worker_id AS INTEGER)))
    )
    SELECT h.task_id FROM fit g
    JOIN task_queue h ON h.task_id = (
        SELECT b.task_id FROM task_queue b
        WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
          AND (NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's (an array's many)
                           WHERE o.worker_id = CAST(:worker_id AS INTEGER) AND +o.job_id = b.job_id
                             AND o.state IN ('assigned', 'running'))
               OR (SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL)
        ORDER BY b.priority + b.aged DESC, b.task_id
        LIMIT 1)
    WHERE (g.nominal_left IS NULL OR g.nominal_left >= 0
           OR (g.nominal_left + g.borrow >= 0
               AND NOT EXISTS (SELECT 1 FROM fit o WHERE o.project_id <> g.project_id AND o.nominal_left >= 0)))
      AND ((SELECT j.state = 'running' AND j.array_size IS NULL FROM jobs j WHERE j.id = h.job_id)
           OR NOT coalesce((SELECT u.at_limit FROM user_running_jobs u WHERE u.user_id = g.user_id), 0))
    ORDER BY h.priority + h.aged DESC,
             (SELECT u.usage FROM project_fair_share u WHERE u.project_id = g.project_id),
             (SELECT u.usage FROM user_fair_share u WHERE u.project_id = g.project_id AND u.user_id = g.user_id),
             h.task_id
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

-- name: task_was_preempted --
-- Was this task stopped for a preemption before (its next run gets GPULAYER_PREEMPTED=1)?
SELECT 1 AS found FROM preemptions WHERE task_id = :task_id AND done_at IS NOT NULL LIMIT 1;

-- name: task_log_base --
-- The number a task's next log line gets (its Assignment's log_base): after those already stored.
SELECT coalesce(max(n) + 1, 0) AS n FROM logs WHERE task_id = :task_id;
