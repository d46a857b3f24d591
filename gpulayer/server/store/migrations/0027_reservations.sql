-- Version 27: reservations with backfill (issue 38). How long a job's task is expected to run
-- (job_runtime_model: its time limit, else learned from its user's earlier runs, else a default) and when
-- each active task is expected to end (task_expected_end); the backfill settings (scheduler_settings);
-- the room held at a future time for the highest-ranked waiting jobs (reservations), released by
-- triggers in the transaction that makes a job unable to use it.
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
