-- Version 36: the claim reads the claimable groups first, then each group's best queued tasks by their id
-- (claimable_tasks: CROSS JOIN task_queue). Without statistics SQLite had chosen to scan every queued task
-- and test each against the groups' lists: 14 ms a one-task claim at 8,000 queued jobs of one shape against
-- 0.7 ms (docs/benchmarks/issue-41.md, "The writer's work per cycle"). task_expected_end likewise reads the
-- active tasks first, then their jobs' runtime model (CROSS JOIN job_runtime_model): it had read every queued
-- job's model (2 ms of each plan of reservations at 8,000 queued, against 0.07 ms). What the views give is unchanged.
DROP VIEW claimable_tasks;
DROP VIEW task_expected_end;

-- When each task that holds room on a worker now (assigned or running; not one leased ahead) is
-- expected to end: from its start (its assignment until it started) plus its job's expected_s
-- (expected_end_at: what reservations and backfill judge by) or typical_s (typical_end_at: what a
-- start-time estimate uses). A task past its expected end is overrunning: it ends when it ends.
CREATE VIEW task_expected_end AS
SELECT t.id AS task_id, t.job_id, t.worker_id, t.state, coalesce(t.started_at, t.assigned_at) AS since,
       coalesce(t.started_at, t.assigned_at) + m.expected_s AS expected_end_at,
       coalesce(t.started_at, t.assigned_at) + m.typical_s AS typical_end_at, m.source
-- CROSS JOIN (schema 36): the active tasks first, then each one's job's model; a plain JOIN let SQLite read
-- the model of every queued job and look its tasks up (2 ms a plan at 8,000 queued instead of 0.07).
FROM tasks t CROSS JOIN job_runtime_model m ON m.job_id = t.job_id
WHERE t.state IN ('assigned', 'running') AND t.ahead = 0;

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
             g.blocked, g.shared, h.task_id, h.job_id, NOT (j.state = 'running' AND j.array_size IS NULL) AS adds_job,
             j.array_size IS NULL AS single, g.reserved,
             row_number() OVER (PARTITION BY g.worker_id
                                ORDER BY h.priority + h.aged DESC, g.project_usage, g.user_usage, h.task_id) AS pos
      FROM (SELECT c.*, EXISTS (SELECT 1 FROM reservations x WHERE x.worker_id = c.worker_id) AS reserved
            FROM claimable_groups c) g
      -- CROSS JOIN: the groups first, then each one's best by task_id (schema 36). A plain JOIN let SQLite,
      -- without statistics (the state file has none), scan every queued task and test it against the list:
      -- 14 ms a claim at 8,000 queued instead of 0.7 (docs/benchmarks/issue-41.md, "The writer's work per cycle").
      CROSS JOIN task_queue h ON h.task_id IN (  -- the group's best, of jobs the worker holds none of (or arrays)
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
