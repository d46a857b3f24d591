-- Version 26: the claim only claims (issue 37). The groups of queued work a worker may take a task of
-- (claimable_groups: fit and room, admission, fair share), the tasks it may claim, ranked once
-- (claimable_tasks), and what one statement may claim of them (claimable_batch) are views; acquire_one
-- and acquire_task are an UPDATE ... RETURNING over them. shape_worker_fit also gives the worker's free
-- room and `by_index`; claim_clock also holds how many tasks of each group the claim reads (`depth`).
ALTER TABLE claim_clock ADD COLUMN depth INTEGER NOT NULL DEFAULT 1 CHECK (depth BETWEEN 1 AND 17);

-- shape_worker_fit gains each worker's free room and `by_index` (made again as 0009 left it, plus those).
DROP VIEW shape_worker_fit;

-- Which workers a shape of work fits, and why not: the one definition of fit, which
-- job_worker_fit reads for jobs and acquisition for queued shapes. One row per shape and
-- worker, whatever the worker's state. Flags are 0 or 1:
--   has_labels       every label the shape asks for is on the worker, with the same value; a
--                    `gpu_model` label (`submit --gpu-model`) is also met by a worker with a GPU
--                    or MIG instance of that model (its `gpu_models`, by index: "1g.10gb",
--                    "NVIDIA H100 ..."); then only GPUs of that model count for it, below
--   has_accelerator  the shape asks for none, or the worker has GPUs
--   big_enough       the worker's GPUs, CPUs and memory cover one task, when idle; a task of
--                    more than one GPU counts only whole GPUs, never MIG instances (a CUDA
--                    process uses one MIG instance: worker_gpus rows whose uuid is MIG-...);
--                    a `gpu_model` met by the GPUs (not by a worker label) counts those of it
--   missing_secret   the first of the shape's secrets (by name) that is not set in its project
--                    or whose labels the worker's join token does not all carry; NULL when it
--                    may have them all
--   fits             all four: the worker could run a task of the shape when idle
--   has_room         a free slot, and free GPUs, CPUs and memory for one task now (worker_load);
--                    for more than one GPU on a worker with MIG instances, as many free whole
--                    GPUs (healthy, held by no task); for a `gpu_model` met by the GPUs, as
--                    many free GPUs of that model
--   schedulable      not cordoned, draining or drained (worker_cordons)
--   fits_now         online, schedulable, fits, has room: it could take a task of the shape of
--                    a job it holds no task of (job_worker_fit.holds_task)
--   spare_gpus       free GPUs left after one task (gang placement packs the tightest first)
--   free_slots, free_gpus, free_cpus, free_memory_mb   the worker's free room now (worker_load)
--   by_index         a task's GPU indices are picked among some of the free ones: whole GPUs beside
--                    MIG instances, or those of a `gpu_model` met by the GPUs; so its room is no sum
CREATE VIEW shape_worker_fit AS
SELECT p.*,
       (p.has_labels AND p.has_accelerator AND p.big_enough AND p.missing_secret IS NULL) AS fits,
       (p.worker_state = 'online' AND p.schedulable AND p.has_labels AND p.has_accelerator AND p.big_enough
        AND p.missing_secret IS NULL AND p.has_room) AS fits_now
FROM (
    SELECT s.id AS shape_id, s.gang, s.queued, l.worker_id, w.state AS worker_state,
           (s.labels = '{}' OR NOT EXISTS (
               SELECT 1 FROM json_each(s.labels) jl
               WHERE NOT EXISTS (SELECT 1 FROM json_each(w.labels) wl
                                 WHERE wl.key = jl.key AND wl.value = jl.value)
                 AND NOT (jl.key = 'gpu_model'  -- a GPU (or MIG instance) of that model at least
                          AND EXISTS (SELECT 1 FROM json_each(w.gpu_models) m WHERE m.value = jl.value))))
           AS has_labels,
           (s.accelerator = '' OR w.gpus > 0) AS has_accelerator,
           (s.gpus <= w.gpus AND s.cpus <= w.cpus AND s.memory_mb <= w.memory_mb
            AND (s.gpus <= 1 OR s.gpus <= w.gpus - (SELECT count(*) FROM worker_gpus g
                                                    WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*'))
            AND (s.gpus = 0 OR s.labels = '{}' OR json_extract(s.labels, '$.gpu_model') IS NULL
                 OR json_extract(s.labels, '$.gpu_model') IS json_extract(w.labels, '$.gpu_model')
                 OR s.gpus <= (SELECT count(*) FROM json_each(w.gpu_models) m  -- its GPUs of that model
                               WHERE m.value = json_extract(s.labels, '$.gpu_model')
                                 AND (s.gpus = 1 OR NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                                WHERE g.worker_id = w.id AND g."index" = m.key
                                                                  AND g.uuid GLOB 'MIG-*')))))
           AS big_enough,
           CASE WHEN s.secrets <> '[]' THEN (
               SELECT sv.value FROM json_each(s.secrets, '$.names') sv
               LEFT JOIN secrets sc ON sc.project_id = json_extract(s.secrets, '$.project') AND sc.name = sv.value
               WHERE sc.name IS NULL  -- deleted since submit: wait until it is set again
                  OR EXISTS (SELECT 1 FROM json_each(sc.labels) sl
                             WHERE NOT EXISTS (SELECT 1 FROM json_each(w.token_labels) tl
                                               WHERE tl.key = sl.key AND tl.value = sl.value))
               ORDER BY sv.value LIMIT 1)
           END AS missing_secret,
           (l.free_slots > 0 AND s.gpus <= l.free_gpus AND s.cpus <= l.free_cpus
            AND s.memory_mb <= l.free_memory_mb
            AND (s.gpus <= 1
                 OR NOT EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*')
                 OR s.gpus <= w.gpus  -- the free whole GPUs: neither MIG nor unhealthy, nor held by a task
                              - (SELECT count(*) FROM worker_gpus g
                                 WHERE g.worker_id = w.id AND (g.healthy = 0 OR g.uuid GLOB 'MIG-*'))
                              - (SELECT count(DISTINCT x.value) FROM tasks t, json_each(t.gpu_indices) x
                                 WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')
                                   AND NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                   WHERE g.worker_id = w.id AND g."index" = x.value
                                                     AND (g.healthy = 0 OR g.uuid GLOB 'MIG-*'))))
            AND (s.gpus = 0 OR s.labels = '{}' OR json_extract(s.labels, '$.gpu_model') IS NULL
                 OR json_extract(s.labels, '$.gpu_model') IS json_extract(w.labels, '$.gpu_model')
                 OR s.gpus <= (SELECT count(*) FROM json_each(w.gpu_models) m  -- its free GPUs of that model
                               WHERE m.value = json_extract(s.labels, '$.gpu_model')
                                 AND NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                 WHERE g.worker_id = w.id AND g."index" = m.key
                                                   AND (g.healthy = 0 OR (s.gpus > 1 AND g.uuid GLOB 'MIG-*')))
                                 AND NOT EXISTS (SELECT 1 FROM tasks t, json_each(t.gpu_indices) x
                                                 WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')
                                                   AND x.value = m.key)))) AS has_room,
           l.free_gpus - s.gpus AS spare_gpus, l.free_slots, l.free_gpus, l.free_cpus, l.free_memory_mb,
           (s.gpus > 1 AND EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*'))
           OR (s.gpus > 0 AND json_extract(s.labels, '$.gpu_model') IS NOT NULL
               AND json_extract(s.labels, '$.gpu_model') IS NOT json_extract(w.labels, '$.gpu_model')) AS by_index,
           NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id) AS schedulable
    FROM shapes s, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;

-- Which groups of queued work (queue_groups: shape, project, user; single tasks, not gangs) each worker
-- may take a task of now, as admission judges them: the shape fits the worker now (shape_worker_fit),
-- beyond the room held on it for a waiting gang (gang_reservations not expired at the claim's time,
-- claim_clock); the project is within its nominal GPU quota
-- (queue_group_quota.nominal_left >= 0 or NULL), or would borrow up to `borrow` beyond it: `blocked`
-- while another project's group the worker may take is within its own (`contested`). `user_left`: the
-- jobs the user may still add (user_running_jobs; NULL without a limit). `by_index`: shape_worker_fit's.
-- project_usage and user_usage: fair share (project_fair_share, user_fair_share) at the claim's time;
-- room_*: the worker's free slots, GPUs, CPUs and memory less the room held for a gang.
CREATE VIEW claimable_groups AS
SELECT c.*, coalesce(c.nominal_left < 0 AND c.contested, 0) AS blocked
FROM (SELECT a.*, coalesce(min(CASE WHEN a.nominal_left >= 0 THEN a.project_id END) OVER w <> a.project_id
                           OR max(CASE WHEN a.nominal_left >= 0 THEN a.project_id END) OVER w <> a.project_id, 0)
                  AS contested
      FROM (SELECT f.worker_id, q.shape_id, q.project_id, q.user_id, q.gpus, s.cpus, s.memory_mb, q.borrow,
                   q.nominal_left, f.by_index,
                   f.free_slots - (SELECT count(*) FROM gang_reservations r
                                   WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_slots,
                   f.free_gpus - (SELECT total(r.gpus) FROM gang_reservations r
                                  WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_gpus,
                   f.free_cpus - (SELECT total(r.cpus) FROM gang_reservations r
                                  WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_cpus,
                   f.free_memory_mb - (SELECT total(r.memory_mb) FROM gang_reservations r
                                       WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_memory_mb,
                   (SELECT u.usage FROM project_fair_share u WHERE u.project_id = q.project_id) AS project_usage,
                   (SELECT u.usage FROM user_fair_share u WHERE u.project_id = q.project_id AND u.user_id = q.user_id)
                   AS user_usage,
                   (SELECT u.max_running_jobs - u.running_jobs FROM user_running_jobs u WHERE u.user_id = q.user_id)
                   AS user_left
            FROM shapes s INDEXED BY shapes_queued
            JOIN shape_worker_fit f ON f.shape_id = s.id
            CROSS JOIN queue_group_quota q ON q.shape_id = s.id
            CROSS JOIN claim_clock k
            WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now  -- and, while a gang holds room on it, room beyond
              AND (NOT EXISTS (SELECT 1 FROM gang_reservations r WHERE r.worker_id = f.worker_id AND r.expires_at > k.now)
                   OR (room_slots >= 1 AND room_gpus >= s.gpus AND room_cpus >= s.cpus
                       AND room_memory_mb >= s.memory_mb))) a
      WINDOW w AS (PARTITION BY a.worker_id)) c
WHERE c.nominal_left IS NULL OR c.nominal_left >= 0 OR c.nominal_left + c.borrow >= 0;  -- admitted, or blocked

-- The tasks each worker may claim, and their rank: `pos`, the ranking written once: priority with its age
-- boost (upkeep's age_queued_tasks) highest first, then fair share, the project's then the user's,
-- lowest first, then first come. Each claimable group offers its best claim_clock.depth tasks (the
-- claim sets it: 1 for one task, one more than it may take for several) of jobs the worker holds none
-- of (an array's elements may share a worker, a job's other replicas may not), down task_queue_shape,
-- so queued tasks it cannot take cost nothing. `adds_job`: it counts against the user's running-jobs
-- limit (not a running job's queued replica; an array's element does). `eligible`: its group is not
-- blocked and it adds no job while its user is at the limit; the first eligible task is the one-task
-- claim's choice (acquire_one). Held tasks (a waiting job's, an array's past its %N cap) are not in
-- task_queue.
CREATE VIEW claimable_tasks AS
SELECT o.*, NOT o.blocked AND NOT (o.adds_job AND coalesce(o.user_left <= 0, 0)) AS eligible
FROM (SELECT g.worker_id, g.shape_id, g.project_id, g.user_id, g.gpus, g.cpus, g.memory_mb, g.borrow, g.nominal_left,
             g.room_slots, g.room_gpus, g.room_cpus, g.room_memory_mb, g.by_index, g.user_left, g.contested,
             g.blocked, h.task_id, h.job_id, NOT (j.state = 'running' AND j.array_size IS NULL) AS adds_job,
             j.array_size IS NULL AS single,
             row_number() OVER (PARTITION BY g.worker_id
                                ORDER BY h.priority + h.aged DESC, g.project_usage, g.user_usage, h.task_id) AS pos
      FROM claimable_groups g
      JOIN task_queue h ON h.task_id IN (  -- the group's best, of jobs the worker holds none of (or arrays)
          SELECT b.task_id FROM task_queue b
          WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
            AND ((SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL
                 OR NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's
                                WHERE o.worker_id = g.worker_id AND +o.job_id = b.job_id
                                  AND o.state IN ('assigned', 'running')))
          ORDER BY b.priority + b.aged DESC, b.task_id LIMIT (SELECT c.depth FROM claim_clock c))
      JOIN jobs j ON j.id = h.job_id) o;

-- What one claim statement of several tasks (acquire_task) may take for each worker, `k` its place: the
-- tasks of claimable_tasks down the ranking, each judged by the room, quota use and running jobs the
-- claims before it leave, as as many one-task claims in a row would judge it. A candidate is neither
-- `replica` (a job's other replica below its first: the worker holds the job once that is claimed),
-- `dead` (its group's best task from here on adds a job while the user is at the limit) nor blocked.
-- Running sums down the ranking stand for the claims before each row: the worker's slots, GPUs, CPUs
-- and memory (room_*), the project's GPUs against `nominal_left` (and `borrow`), the user's added jobs
-- against `user_left`. `sure`: the first candidate (the one-task claim's choice), then those before the
-- first row the sums cannot be sure of (`stop_here`): a candidate whose sums no longer fit, one whose
-- GPU indices are picked by index (only as the first: its room is no sum), a blocked group's row (it may
-- become the better choice once another project leaves its nominal quota); and none after a group's
-- last row read (`stop_after`: its rest was not). Conservative, never more: placement.acquire_many
-- claims again when fewer came back than asked. An array's %N cap needs no sum (its held elements are
-- not in task_queue). Each level's windows share one partition, so that a `worker_id = ?` reaches the
-- views below.
CREATE VIEW claimable_batch AS
WITH
flagged AS (  -- dead, unread_after: by group
    SELECT e.*, max(e.adds_job AND coalesce(e.user_left <= 0, 0)) OVER g AS dead,
           row_number() OVER g = (SELECT c.depth FROM claim_clock c) AS unread_after
    FROM claimable_tasks e
    WINDOW g AS (PARTITION BY e.worker_id, e.shape_id, e.project_id, e.user_id ORDER BY e.pos)
),
candidates AS (  -- replica: by job
    SELECT r.*, NOT r.replica AND NOT r.dead AND NOT r.blocked AS candidate
    FROM (SELECT d.*, d.single AND row_number() OVER (PARTITION BY d.worker_id, d.job_id ORDER BY d.pos) > 1 AS replica
          FROM flagged d) r
),
sums AS (  -- what the candidates up to each row (itself included) ask, in claim order
    SELECT c.*, sum(c.candidate) OVER w AS k, sum(c.candidate * c.gpus) OVER w AS sum_gpus,
           sum(c.candidate * c.cpus) OVER w AS sum_cpus, sum(c.candidate * c.memory_mb) OVER w AS sum_memory_mb
    FROM candidates c
    WINDOW w AS (PARTITION BY c.worker_id ORDER BY c.pos ROWS UNBOUNDED PRECEDING)
),
project_sums AS (  -- the project's GPUs claimed before the row
    SELECT s.*, coalesce(sum(s.candidate * s.gpus) OVER (PARTITION BY s.worker_id, s.project_id ORDER BY s.pos
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                AS project_gpus_before
    FROM sums s
),
user_sums AS (  -- the user's jobs added before the row
    SELECT p.*, coalesce(sum(p.candidate * p.adds_job) OVER (PARTITION BY p.worker_id, p.user_id ORDER BY p.pos
                                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                AS jobs_before
    FROM project_sums p
),
stops AS (  -- stop_here: a misfit, or a blocked group's row; stop_after: a group's last row read
    SELECT u.worker_id, u.task_id, u.pos, u.k, u.candidate,
           (u.blocked AND NOT u.dead) OR (u.candidate AND (
               u.k > u.room_slots OR u.sum_gpus > u.room_gpus OR u.sum_cpus > u.room_cpus
               OR u.sum_memory_mb > u.room_memory_mb OR (u.k > 1 AND u.by_index)
               OR CASE WHEN u.nominal_left IS NULL OR u.nominal_left - u.project_gpus_before >= 0 THEN 0
                       WHEN u.contested THEN 1
                       ELSE u.nominal_left - u.project_gpus_before + u.borrow < 0 END
               OR (u.adds_job AND coalesce(u.user_left - u.jobs_before <= 0, 0)))) AS stop_here,
           u.unread_after AND NOT u.dead AS stop_after
    FROM user_sums u
)
SELECT b.worker_id, b.task_id, b.k, b.candidate AND (b.k = 1 OR (b.stops_before = 0 AND NOT b.stop_here)) AS sure
FROM (SELECT t.*, coalesce(sum(t.stop_here OR t.stop_after)
                           OVER (PARTITION BY t.worker_id ORDER BY t.pos ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                           0) AS stops_before
      FROM stops t) b;
