-- Version 29: the claim beside a reservation (issue 38) reads each reservation's gain (reservation_room:
-- every active task's expected end on its worker, from job_runtime_model) once a claim, in a materialized
-- `rooms`, not once for each queued task it judges (28 ms a claim with 1,000 mixed queued jobs;
-- docs/benchmarks/issue-38.md, "The claim beside a reservation"). claimable_tasks and claimable_batch are
-- made again as 0027 left them, plus that; what they give is unchanged. claim_clock.worker_id: the worker a
-- claim is for, whose reservations alone it reads the room of (NULL: every worker's).
ALTER TABLE claim_clock ADD COLUMN worker_id INTEGER;
DROP VIEW claimable_batch;
DROP VIEW claimable_tasks;

-- The tasks each worker may claim, and their rank: `pos`, the ranking written once: priority with its age
-- boost (upkeep's age_queued_tasks) highest first, then fair share, the project's then the user's,
-- lowest first, then first come. Each claimable group offers its best claim_clock.depth tasks (the
-- claim sets it: 1 for one task, one more than it may take for several) of jobs the worker holds none
-- of (an array's elements may share a worker, a job's other replicas may not), down task_queue_shape,
-- so queued tasks it cannot take cost nothing. `adds_job`: it counts against the user's running-jobs
-- limit (not a running job's queued replica; an array's element does). `eligible`: its group is not
-- blocked and it adds no job while its user is at the limit; the first eligible task is the one-task
-- claim's choice (acquire_one). Held tasks (a waiting job's, an array's past its %N cap) are not in
-- task_queue. EASY backfill: on a worker holding a reservation of another job (`reserved`), a task that
-- would use room the reservation needs at its start (its room now plus reservation_room's gain) is not
-- offered unless it is expected to end by then (the claim's now plus its job's expected_s) and its job
-- may be backfilled (spec `backfill`, default true); a group offers its best tasks that are, among its
-- best claim_clock.depth + 32 while any reservation exists (claimable_batch is sure of a reserved worker's
-- first task only). Each reservation's gain (reservation_room's, read from `ends`: each active task's
-- expected end, from job_runtime_model, read once, not once for each reservation and resource) is read once
-- a claim (`rooms`, materialized), not once for each task it judges, and only the claim's worker's
-- (claim_clock.worker_id; every worker's when NULL) (schema 29).
CREATE VIEW claimable_tasks AS
WITH
ends AS MATERIALIZED (  -- task_expected_end of the claim's worker's tasks, if it holds a reservation: once a claim
    SELECT e.worker_id, e.expected_end_at, j.gpus, j.cpus, j.memory_mb
    FROM task_expected_end e JOIN jobs j ON j.id = e.job_id, claim_clock k
    WHERE e.worker_id IN (SELECT x.worker_id FROM reservations x WHERE k.worker_id IS NULL OR x.worker_id = k.worker_id)
),
rooms AS MATERIALIZED (  -- reservation_room of the claim's worker, from `ends`: once a claim, not once a task
    SELECT r.worker_id, r.job_id, r.start_at,
           (SELECT count(*) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.tasks) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_slots,
           (SELECT total(e.gpus) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.gpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_gpus,
           (SELECT total(e.cpus) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.cpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_cpus,
           (SELECT total(e.memory_mb) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.memory_mb) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_memory_mb
    FROM reservations r, claim_clock k
    WHERE k.worker_id IS NULL OR r.worker_id = k.worker_id
)
SELECT o.*, NOT o.blocked AND NOT (o.adds_job AND coalesce(o.user_left <= 0, 0)) AS eligible
FROM (SELECT g.worker_id, g.shape_id, g.project_id, g.user_id, g.gpus, g.cpus, g.memory_mb, g.borrow, g.nominal_left,
             g.room_slots, g.room_gpus, g.room_cpus, g.room_memory_mb, g.by_index, g.user_left, g.contested,
             g.blocked, h.task_id, h.job_id, NOT (j.state = 'running' AND j.array_size IS NULL) AS adds_job,
             j.array_size IS NULL AS single, g.reserved,
             row_number() OVER (PARTITION BY g.worker_id
                                ORDER BY h.priority + h.aged DESC, g.project_usage, g.user_usage, h.task_id) AS pos
      FROM (SELECT c.*, EXISTS (SELECT 1 FROM reservations x WHERE x.worker_id = c.worker_id) AS reserved
            FROM claimable_groups c) g
      JOIN task_queue h ON h.task_id IN (  -- the group's best, of jobs the worker holds none of (or arrays)
          SELECT a.task_id FROM (
              SELECT b.task_id, b.job_id, b.priority + b.aged AS rank_priority FROM task_queue b
              WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
                AND ((SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL
                     OR NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's
                                    WHERE o.worker_id = g.worker_id AND +o.job_id = b.job_id
                                      AND o.state IN ('assigned', 'running')))
              ORDER BY b.priority + b.aged DESC, b.task_id
              LIMIT (SELECT c.depth + 32 * EXISTS (SELECT 1 FROM reservations) FROM claim_clock c)) a
          WHERE NOT g.reserved OR NOT EXISTS (  -- room a reservation needs at its start, still held then
              SELECT 1 FROM rooms r, jobs rj, claim_clock k
              WHERE r.worker_id = g.worker_id AND r.job_id <> a.job_id AND rj.id = a.job_id
                AND (g.room_slots + r.gain_slots < 1 OR g.room_gpus + r.gain_gpus < g.gpus
                     OR g.room_cpus + r.gain_cpus < g.cpus OR g.room_memory_mb + r.gain_memory_mb < g.memory_mb)
                AND (NOT coalesce(json_extract(rj.spec, '$.backfill'), 1)
                     OR k.now + (SELECT m.expected_s FROM job_runtime_model m WHERE m.job_id = a.job_id) > r.start_at))
          ORDER BY a.rank_priority DESC, a.task_id LIMIT (SELECT c.depth FROM claim_clock c))
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
-- GPU indices are picked by index (only as the first: its room is no sum), any but the first on a worker
-- holding a reservation (`reserved`: the room each claim leaves beyond it is no running sum either), a
-- blocked group's row (it may
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
               OR u.sum_memory_mb > u.room_memory_mb OR (u.k > 1 AND (u.by_index OR u.reserved))
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
