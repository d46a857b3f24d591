-- Version 27: reservations with backfill (issue 38). How long a job's task is expected to run
-- (job_runtime_model: its time limit, else learned from its user's earlier runs, else a default) and when
-- each active task is expected to end (task_expected_end); the backfill settings (scheduler_settings);
-- the room held at a future time for the highest-ranked waiting jobs (reservations), released by
-- triggers in the transaction that makes a job unable to use it, and what a worker has beyond them
-- (reservation_room); the claim honours them (claimable_tasks, claimable_batch: made again as 0026 left
-- them, plus that).
ALTER TABLE scheduler_settings ADD COLUMN default_runtime_s REAL NOT NULL DEFAULT 3600 CHECK (default_runtime_s > 0);
ALTER TABLE scheduler_settings ADD COLUMN backfill INTEGER NOT NULL DEFAULT 1 CHECK (backfill IN (0, 1));
ALTER TABLE scheduler_settings ADD COLUMN backfill_depth INTEGER NOT NULL DEFAULT 1 CHECK (backfill_depth BETWEEN 1 AND 100);
ALTER TABLE scheduler_settings ADD COLUMN backfill_max_jobs INTEGER NOT NULL DEFAULT 100 CHECK (backfill_max_jobs BETWEEN 1 AND 100000);

-- job_runtime_model reads a user's latest runs of a job name (or of unnamed jobs) from here.
CREATE INDEX usage_user_name ON usage (user_id, job_name, ended_at);

-- How long each task of a job that has not ended (queued, waiting or running) is expected to run, in
-- seconds, one row per job:
--   limit_s     its time limit (the spec's `timeout_seconds`: `submit --time`, `job update`), or NULL
--   runs        its user's latest ended runs (at most 20) of the same job name, or, for a job without a
--               name, of unnamed jobs with the same command: runs that ended on their own (succeeded,
--               failed, timed out; not cancelled, lost, preempted or requeued); the usage ledger
--   learned_s   the 90th percentile of those runs' durations (the shortest >= 90% of them), NULL with
--               fewer than 3; median_s their median (the lower middle one)
--   default_s   the documented default for a job with neither (`server start --default-runtime`, 3600)
--   limit_ratio the median of run time over time limit of the cluster's latest 200 ended runs (of jobs
--               that had one and still exist), NULL with fewer than 3: users overestimate their limits
--   expected_s  coalesce(limit_s, learned_s, default_s): what backfill and reservations judge by (a task
--               may run until its limit, so a reservation made from it is safe)
--   typical_s   what a start-time estimate should use: the median of its runs, never beyond the limit;
--               else the limit times limit_ratio; else the limit; else the default
--   source      'limit', 'history' or 'default': where expected_s came from
CREATE VIEW job_runtime_model AS
SELECT m.job_id, m.state, m.limit_s, m.runs, CASE WHEN m.runs >= 3 THEN m.p90_s END AS learned_s,
       CASE WHEN m.runs >= 3 THEN m.median_s END AS median_s, m.default_s, m.limit_ratio,
       coalesce(m.limit_s, CASE WHEN m.runs >= 3 THEN m.p90_s END, m.default_s) AS expected_s,
       CASE WHEN m.runs >= 3 THEN min(m.median_s, coalesce(m.limit_s, m.median_s))
            ELSE coalesce(m.limit_s * m.limit_ratio, m.limit_s, m.default_s) END AS typical_s,
       CASE WHEN m.limit_s IS NOT NULL THEN 'limit' WHEN m.runs >= 3 THEN 'history' ELSE 'default' END AS source
FROM (SELECT h.job_id, h.state, h.limit_s, h.default_s, h.limit_ratio, json_extract(h.history, '$[0]') AS runs,
             json_extract(h.history, '$[1]') AS p90_s, json_extract(h.history, '$[2]') AS median_s
      FROM (SELECT j.id AS job_id, j.state, json_extract(j.spec, '$.timeout_seconds') AS limit_s,
                   st.default_runtime_s AS default_s,
                   (SELECT CASE WHEN count(*) >= 3 THEN max(CASE WHEN r.pos = (r.n + 1) / 2 THEN r.ratio END) END
                    FROM (SELECT x.ratio, row_number() OVER (ORDER BY x.ratio) AS pos, count(*) OVER () AS n
                          FROM (SELECT (u.ended_at - u.started_at) / json_extract(o.spec, '$.timeout_seconds') AS ratio
                                FROM (SELECT * FROM usage ORDER BY ended_at DESC LIMIT 200) u
                                JOIN jobs o ON o.id = u.job_id
                                WHERE u.outcome IN ('succeeded', 'failed', 'timed_out')
                                  AND json_extract(o.spec, '$.timeout_seconds') > 0) x) r) AS limit_ratio,
                   (SELECT json_array(count(*), max(CASE WHEN r.pos = (r.n * 9 + 9) / 10 THEN r.run_s END),
                                      max(CASE WHEN r.pos = (r.n + 1) / 2 THEN r.run_s END))
                    FROM (SELECT x.run_s, row_number() OVER (ORDER BY x.run_s) AS pos, count(*) OVER () AS n
                          FROM (SELECT u.ended_at - u.started_at AS run_s FROM usage u
                                WHERE u.user_id = j.user_id AND u.job_name IS j.name
                                  AND u.outcome IN ('succeeded', 'failed', 'timed_out')
                                  AND (j.name IS NOT NULL
                                       OR (SELECT json_extract(o.spec, '$.command') FROM jobs o WHERE o.id = u.job_id)
                                          = json_extract(j.spec, '$.command'))
                                ORDER BY u.ended_at DESC LIMIT 20) x) r) AS history
            FROM jobs j CROSS JOIN scheduler_settings st
            WHERE j.state IN ('queued', 'running', 'waiting')) h) m;

-- When each task that holds room on a worker now (assigned or running; not one leased ahead) is
-- expected to end: from its start (its assignment until it started) plus its job's expected_s
-- (expected_end_at: what reservations and backfill judge by) or typical_s (typical_end_at: what a
-- start-time estimate uses). A task past its expected end is overrunning: it ends when it ends.
CREATE VIEW task_expected_end AS
SELECT t.id AS task_id, t.job_id, t.worker_id, t.state, coalesce(t.started_at, t.assigned_at) AS since,
       coalesce(t.started_at, t.assigned_at) + m.expected_s AS expected_end_at,
       coalesce(t.started_at, t.assigned_at) + m.typical_s AS typical_end_at, m.source
FROM tasks t JOIN job_runtime_model m ON m.job_id = t.job_id
WHERE t.state IN ('assigned', 'running') AND t.ahead = 0;

-- Reservations (EASY backfill, like Slurm's): room on a worker held from `start_at` for a waiting job
-- that fits no worker now, where and when it can start earliest (the running tasks' expected ends and
-- the reservations made before it), for the highest-ranked waiting jobs of each group of workers (upkeep's
-- plan_reservations rewrites them every tick: `planned_at`). A row per worker it will use (a gang's
-- ranks: several workers at once): `tasks` of its tasks there, their GPUs, CPUs and memory. Until then,
-- the claim gives a worker another queued task that would use the room only if that task is expected
-- to end (now + its expected_s) by `start_at`. `reason`: why it waits, as job status shows it. Deleted
-- in the transaction that makes the job unable to use it (it leaves the queue: placed, cancelled,
-- waiting; it is held), or the worker (it goes offline or away, it is cordoned), or when the job holds
-- room now instead (gang_reservations, below: the two never both hold room for one job).
CREATE TABLE reservations (
    job_id      INTEGER NOT NULL,
    worker_id   INTEGER NOT NULL,
    tasks       INTEGER NOT NULL CHECK (tasks >= 1),
    gpus        INTEGER NOT NULL CHECK (gpus >= 0),    -- of all its tasks there
    cpus        REAL NOT NULL CHECK (cpus >= 0),
    memory_mb   INTEGER NOT NULL CHECK (memory_mb >= 0),
    start_at    REAL NOT NULL,
    planned_at  REAL NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (job_id, worker_id)
) STRICT;
-- The claim asks for a worker's reservations.
CREATE INDEX reservations_worker ON reservations (worker_id, start_at);

CREATE TRIGGER jobs_reservations_end AFTER UPDATE OF state ON jobs
WHEN old.state = 'queued' AND new.state <> 'queued' BEGIN
    DELETE FROM reservations WHERE job_id = new.id;
END;
CREATE TRIGGER jobs_reservations_held AFTER UPDATE OF hold ON jobs WHEN new.hold = 1 BEGIN
    DELETE FROM reservations WHERE job_id = new.id;
END;
CREATE TRIGGER workers_reservations_gone AFTER UPDATE OF state ON workers WHEN new.state <> 'online' BEGIN
    DELETE FROM reservations WHERE worker_id = new.id;
END;
CREATE TRIGGER worker_cordons_reservations AFTER INSERT ON worker_cordons BEGIN
    DELETE FROM reservations WHERE worker_id = new.worker_id;
END;
CREATE TRIGGER gang_reservations_supersede AFTER INSERT ON gang_reservations BEGIN
    DELETE FROM reservations WHERE job_id = new.job_id;
END;

-- What each worker gains by each reservation's start, beyond its reservations (below 0: it loses): what
-- its active tasks expected to have ended by then free (task_expected_end), less what the reservations on
-- it that start by then hold (the reservation's own included). One row per reservation. Its room then is
-- its free room now (worker_load) plus the gain: the claim (claimable_tasks) gives a task that would still
-- run at a reservation's start only room within it.
CREATE VIEW reservation_room AS
SELECT r.worker_id, r.job_id, r.start_at,
       (SELECT count(*) FROM task_expected_end e
                       WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.tasks) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_slots,
       (SELECT total(j.gpus) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                      WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.gpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_gpus,
       (SELECT total(j.cpus) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                      WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.cpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_cpus,
       (SELECT total(j.memory_mb) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                           WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.memory_mb) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_memory_mb
FROM reservations r;

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
-- first task only).
CREATE VIEW claimable_tasks AS
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
              SELECT 1 FROM reservation_room r, jobs rj, claim_clock k
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
