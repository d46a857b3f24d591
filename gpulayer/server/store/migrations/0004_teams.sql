-- Version 4: teams (issue 15). Users, projects and memberships; client tokens belong to a
-- user; every job records its owner and project; every event its actor; secrets belong to a
-- project. An older file's jobs, client tokens and secrets all go to the first admin user
-- `admin` (id 1) and the project `default` (id 1), so an existing setup behaves as before.

-- People who hold client tokens. Id 1 is `admin`, the owner of `server init`'s token.
CREATE TABLE users (
    id                INTEGER PRIMARY KEY,
    name              TEXT NOT NULL UNIQUE,
    admin             INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    max_running_jobs  INTEGER CHECK (max_running_jobs IS NULL OR max_running_jobs >= 0),
    created_at        REAL NOT NULL,
    removed_at        REAL
) STRICT;

-- Groups of users that share GPUs (Slurm accounts, Kueue queues). Id 1 is `default`.
CREATE TABLE projects (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    visibility  TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN (
                    'private',  -- members see that each other's jobs exist, not their logs or outputs
                    'project'   -- members read each other's logs and outputs
                )),
    gpu_quota   INTEGER CHECK (gpu_quota IS NULL OR gpu_quota >= 0),  -- nominal; NULL = no quota
    gpu_borrow  INTEGER NOT NULL DEFAULT 0 CHECK (gpu_borrow >= 0),
    weight      REAL CHECK (weight IS NULL OR weight > 0),
    created_at  REAL NOT NULL
) STRICT;

-- Who is in which project, as what (an admin needs no membership).
CREATE TABLE memberships (
    user_id     INTEGER NOT NULL REFERENCES users (id),
    project_id  INTEGER NOT NULL REFERENCES projects (id),
    role        TEXT NOT NULL CHECK (role IN ('manager', 'member')),
    PRIMARY KEY (user_id, project_id)
) STRICT;
CREATE INDEX memberships_project ON memberships (project_id, user_id);

INSERT INTO users (id, name, admin, created_at) VALUES (1, 'admin', 1, (julianday('now') - 2440587.5) * 86400.0);
INSERT INTO projects (id, name, created_at) VALUES (1, 'default', (julianday('now') - 2440587.5) * 86400.0);

ALTER TABLE tokens ADD COLUMN user_id INTEGER;
UPDATE tokens SET user_id = 1 WHERE kind = 'client';

ALTER TABLE jobs ADD COLUMN user_id INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN project_id INTEGER NOT NULL DEFAULT 1;
-- `job list` (your jobs, a project's jobs) and the running-jobs limit read these.
CREATE INDEX jobs_user_state ON jobs (user_id, state);
-- A user's own jobs newest first (`job list`), without reading everyone else's.
CREATE INDEX jobs_user_id ON jobs (user_id, id);
CREATE INDEX jobs_project_state ON jobs (project_id, state);

ALTER TABLE events ADD COLUMN actor TEXT;

-- Secrets belong to a project: the table is rebuilt with (project_id, name) as its key. The
-- views that read it go first (a rename would rewrite them), and come back below.
DROP VIEW job_worker_fit;
DROP VIEW shape_worker_fit;
ALTER TABLE secrets RENAME TO secrets_v3;
CREATE TABLE secrets (
    project_id  INTEGER NOT NULL DEFAULT 1 REFERENCES projects (id),
    name        TEXT NOT NULL,
    labels      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    ciphertext  BLOB NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (project_id, name)
) STRICT;
INSERT INTO secrets (project_id, name, labels, ciphertext, created_at, updated_at)
SELECT 1, name, labels, ciphertext, created_at, updated_at FROM secrets_v3;
DROP TABLE secrets_v3;

-- A shape that uses secrets names its project too ({"project": id, "names": [...]}), since
-- the same name is another secret in another project; without secrets it stays '[]'.
UPDATE shapes SET secrets = json_object('project', 1, 'names', json(secrets)) WHERE secrets <> '[]';

DROP TRIGGER jobs_shape;
DROP VIEW job_shape;

CREATE TRIGGER jobs_shape AFTER INSERT ON jobs BEGIN
    INSERT OR IGNORE INTO shapes (gang, gpus, cpus, memory_mb, accelerator, labels, secrets)
    VALUES (new.gang, new.gpus, new.cpus, new.memory_mb, coalesce(new.accelerator, ''), new.labels,
            CASE WHEN new.secrets = '[]' THEN '[]'
                 ELSE json_object('project', new.project_id, 'names', json(new.secrets)) END);
END;

-- The shape of each job (shapes: the requirement its placement reads).
CREATE VIEW job_shape AS
SELECT j.id AS job_id, j.state AS job_state, s.id AS shape_id
FROM jobs j
JOIN shapes s ON s.gang = j.gang AND s.gpus = j.gpus AND s.cpus = j.cpus AND s.memory_mb = j.memory_mb
             AND s.accelerator = coalesce(j.accelerator, '') AND s.labels = j.labels
             AND s.secrets = CASE WHEN j.secrets = '[]' THEN '[]'
                                  ELSE json_object('project', j.project_id, 'names', json(j.secrets)) END;

-- Which workers a shape of work fits, and why not: the one definition of fit, which
-- job_worker_fit reads for jobs and acquisition for queued shapes. One row per shape and
-- worker, whatever the worker's state. Flags are 0 or 1:
--   has_labels       every label the shape asks for is on the worker, with the same value
--   has_accelerator  the shape asks for none, or the worker has GPUs
--   big_enough       the worker's GPUs, CPUs and memory cover one task, when idle
--   missing_secret   the first of the shape's secrets (by name) that is not set in its project
--                    or whose labels the worker's join token does not all carry; NULL when it
--                    may have them all
--   fits             all four: the worker could run a task of the shape when idle
--   has_room         a free slot, and free GPUs, CPUs and memory for one task now (worker_load)
--   fits_now         online, fits, has room: it could take a task of the shape of a job it
--                    holds no task of (job_worker_fit.holds_task)
--   spare_gpus       free GPUs left after one task (gang placement packs the tightest first)
CREATE VIEW shape_worker_fit AS
SELECT p.*,
       (p.has_labels AND p.has_accelerator AND p.big_enough AND p.missing_secret IS NULL) AS fits,
       (p.worker_state = 'online' AND p.has_labels AND p.has_accelerator AND p.big_enough
        AND p.missing_secret IS NULL AND p.has_room) AS fits_now
FROM (
    SELECT s.id AS shape_id, s.gang, s.queued, l.worker_id, w.state AS worker_state,
           (s.labels = '{}' OR NOT EXISTS (
               SELECT 1 FROM json_each(s.labels) jl
               WHERE NOT EXISTS (SELECT 1 FROM json_each(w.labels) wl
                                 WHERE wl.key = jl.key AND wl.value = jl.value))) AS has_labels,
           (s.accelerator = '' OR w.gpus > 0) AS has_accelerator,
           (s.gpus <= w.gpus AND s.cpus <= w.cpus AND s.memory_mb <= w.memory_mb) AS big_enough,
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
            AND s.memory_mb <= l.free_memory_mb) AS has_room,
           l.free_gpus - s.gpus AS spare_gpus
    FROM shapes s, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;

-- Which workers a job fits, and why not: shape_worker_fit for the job's shape, read by
-- acquire's waiting reasons, gang placement, provisioning and the explorer. One row per
-- job and worker, whatever their states (filter on job_state / worker_state). The flags
-- are its shape's (above), and:
--   holds_task       it holds an active task of the job already (one replica per worker)
--   fits_now         online, fits, has room, holds none: acquire would give it a task of the job
CREATE VIEW job_worker_fit AS
SELECT p.job_id, p.job_state, p.worker_id, p.worker_state, p.has_labels, p.has_accelerator,
       p.big_enough, p.missing_secret, p.has_room, p.holds_task, p.spare_gpus, p.fits,
       (p.shape_fits_now AND NOT p.holds_task) AS fits_now
FROM (
    SELECT js.job_id, js.job_state, f.worker_id, f.worker_state, f.has_labels, f.has_accelerator,
           f.big_enough, f.missing_secret, f.has_room, f.spare_gpus, f.fits, f.fits_now AS shape_fits_now,
           EXISTS (SELECT 1 FROM tasks o
                   WHERE o.worker_id = f.worker_id AND o.job_id = js.job_id
                     AND o.state IN ('assigned', 'running')) AS holds_task
    FROM job_shape js
    JOIN shape_worker_fit f ON f.shape_id = js.shape_id
) p;

-- ---------------------------------------------------------------------------------------
-- Part B of issue 15 (quotas, borrowing, fair share, priority classes, preemption, the
-- usage ledger): its tables and columns go below this line.

ALTER TABLE jobs ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 0 CHECK (preemptible IN (0, 1));

ALTER TABLE task_queue ADD COLUMN project_id INTEGER NOT NULL DEFAULT 1;
ALTER TABLE task_queue ADD COLUMN user_id INTEGER NOT NULL DEFAULT 1;
UPDATE task_queue SET (project_id, user_id) = (SELECT j.project_id, j.user_id FROM jobs j WHERE j.id = task_queue.job_id);
DROP INDEX task_queue_shape;
-- By shape, then project and user (queue_groups), best first: acquire takes each admitted
-- group's best task from here.
CREATE INDEX task_queue_shape ON task_queue (shape_id, project_id, user_id, priority DESC, task_id);

-- Queued work by shape, project and user: acquire judges a project's GPU quota and a user's
-- running-jobs limit once per group, then takes each admitted group's best task
-- (task_queue_shape), so the queued tasks of a project at its quota cost it nothing. A row
-- while its group has queued tasks, kept by the two triggers below.
CREATE TABLE queue_groups (
    shape_id    INTEGER NOT NULL,
    project_id  INTEGER NOT NULL,
    user_id     INTEGER NOT NULL,
    queued      INTEGER NOT NULL CHECK (queued >= 0),  -- its rows in task_queue
    PRIMARY KEY (shape_id, project_id, user_id)
) STRICT;
INSERT INTO queue_groups (shape_id, project_id, user_id, queued)
SELECT shape_id, project_id, user_id, count(*) FROM task_queue GROUP BY shape_id, project_id, user_id;

CREATE TRIGGER task_queue_group_in AFTER INSERT ON task_queue BEGIN
    UPDATE task_queue SET (project_id, user_id) = (SELECT j.project_id, j.user_id FROM jobs j WHERE j.id = new.job_id)
    WHERE task_id = new.task_id;
    INSERT INTO queue_groups (shape_id, project_id, user_id, queued)
    SELECT new.shape_id, j.project_id, j.user_id, 1 FROM jobs j WHERE j.id = new.job_id
    ON CONFLICT (shape_id, project_id, user_id) DO UPDATE SET queued = queued + 1;
END;
CREATE TRIGGER task_queue_group_out AFTER DELETE ON task_queue BEGIN
    UPDATE queue_groups SET queued = queued - 1
    WHERE shape_id = old.shape_id AND project_id = old.project_id AND user_id = old.user_id;
    DELETE FROM queue_groups
    WHERE shape_id = old.shape_id AND project_id = old.project_id AND user_id = old.user_id AND queued = 0;
END;

-- Settings the scheduler's SQL reads: one row, written by the control plane at start
-- (`server start --fairshare-half-life`, `--preempt-grace`).
CREATE TABLE scheduler_settings (
    id                     INTEGER PRIMARY KEY CHECK (id = 1),
    fairshare_half_life_s  REAL NOT NULL CHECK (fairshare_half_life_s > 0),
    preempt_grace_s        REAL NOT NULL CHECK (preempt_grace_s >= 0)
) STRICT;
INSERT INTO scheduler_settings (id, fairshare_half_life_s, preempt_grace_s) VALUES (1, 604800, 30);

-- Fair share: what each user used in each project, in GPU-seconds (CPU-seconds for a task
-- without GPUs): `usage`, of the runs that ended, decayed by the half-life to `updated_at`
-- (written with the usage row in the transaction that ends a run), plus `running`, of the runs
-- still going so far (rewritten by upkeep every few seconds). Acquire orders work of the same
-- priority by its project's usage over the project's share, then its user's.
CREATE TABLE fairshare (
    project_id  INTEGER NOT NULL,
    user_id     INTEGER NOT NULL,
    usage       REAL NOT NULL CHECK (usage >= 0),
    updated_at  REAL NOT NULL,
    running     REAL NOT NULL DEFAULT 0 CHECK (running >= 0),
    PRIMARY KEY (project_id, user_id)
) STRICT;

-- The usage ledger (accounting, like Slurm's sacct): one row per task run, written in the
-- transaction that ends the run (finish, loss, preemption, a gang sent back to the queue).
-- No reference to jobs or tasks: it outlives their retention. A task that never started
-- ran nothing and has no row.
CREATE TABLE usage (
    id            INTEGER PRIMARY KEY,
    task_id       INTEGER NOT NULL,
    job_id        INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    job_name      TEXT,
    labels        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),  -- the job's
    user_id       INTEGER NOT NULL,
    project_id    INTEGER NOT NULL,
    worker_id     INTEGER,
    worker_name   TEXT,
    gpus          INTEGER NOT NULL CHECK (gpus >= 0),
    cpus          REAL NOT NULL CHECK (cpus >= 0),
    started_at    REAL NOT NULL,
    ended_at      REAL NOT NULL,
    gpu_seconds   REAL NOT NULL CHECK (gpu_seconds >= 0),
    cpu_seconds   REAL NOT NULL CHECK (cpu_seconds >= 0),
    outcome       TEXT NOT NULL CHECK (outcome IN (
                      'succeeded', 'failed', 'timed_out', 'cancelled', 'lost',
                      'preempted',  -- stopped to make room; the task went back to the queue, same attempt
                      'requeued'    -- a gang sent back to the queue whole (a rank not started in time)
                  )),
    preempted_by  INTEGER,          -- the task that needed the room (outcome preempted)
    CHECK (ended_at >= started_at)
) STRICT;
CREATE INDEX usage_ended ON usage (ended_at);
-- Preemption's first question each round: the lowest priority of running preemptible work.
CREATE INDEX jobs_running_preemptible ON jobs (priority) WHERE state = 'running' AND preemptible = 1;

-- A run that ended (finish, loss, cancel, a GPU gone bad, a restore's reconciliation: any
-- statement that ends a running task) gets its usage row and its charge to fair share in that
-- same statement. A run sent back to the queue instead (a preemption, a gang released) has no
-- finished_at: the scheduler writes its row (query insert_usage) before it requeues the task.
CREATE TRIGGER tasks_run_ended AFTER UPDATE OF state ON tasks
WHEN old.state = 'running' AND new.finished_at IS NOT NULL AND old.started_at IS NOT NULL BEGIN
    INSERT INTO usage (task_id, job_id, attempt, job_name, labels, user_id, project_id, worker_id, worker_name,
                       gpus, cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome)
    SELECT new.id, new.job_id, new.attempt, j.name, j.labels, j.user_id, j.project_id, old.worker_id, w.name,
           j.gpus, j.cpus, old.started_at, max(new.finished_at, old.started_at),
           j.gpus * max(new.finished_at - old.started_at, 0), j.cpus * max(new.finished_at - old.started_at, 0),
           CASE WHEN new.outcome = 'timed_out' THEN 'timed_out' ELSE new.state END
    FROM jobs j LEFT JOIN workers w ON w.id = old.worker_id
    WHERE j.id = new.job_id;
    INSERT INTO fairshare (project_id, user_id, usage, updated_at)
    SELECT j.project_id, j.user_id,
           CASE WHEN j.gpus > 0 THEN j.gpus ELSE j.cpus END * max(new.finished_at - old.started_at, 0), new.finished_at
    FROM jobs j WHERE j.id = new.job_id
    ON CONFLICT (project_id, user_id) DO UPDATE
    SET usage = usage * pow(0.5, max(excluded.updated_at - updated_at, 0)
                                 / (SELECT fairshare_half_life_s FROM scheduler_settings)) + excluded.usage,
        updated_at = max(updated_at, excluded.updated_at);
END;

-- Preemptions: a row per victim, written when the scheduler asks its worker to stop it to
-- make room for `for_task_id`; `done_at` once it stopped and went back to the queue. A
-- request older than the task's latest assignment is void (the task was placed again).
CREATE TABLE preemptions (
    id            INTEGER PRIMARY KEY,
    task_id       INTEGER NOT NULL,
    job_id        INTEGER NOT NULL,
    worker_id     INTEGER NOT NULL,
    for_task_id   INTEGER NOT NULL,
    for_job_id    INTEGER NOT NULL,
    reason        TEXT NOT NULL CHECK (reason IN (
                      'priority',  -- preemptible work of a lower priority
                      'borrowed'   -- work over its project's nominal quota, for a project within its own
                  )),
    asked_at      REAL NOT NULL,
    done_at       REAL
) STRICT;
CREATE INDEX preemptions_task ON preemptions (task_id, done_at);
CREATE INDEX preemptions_for ON preemptions (for_task_id) WHERE done_at IS NULL;
CREATE INDEX preemptions_worker ON preemptions (worker_id) WHERE done_at IS NULL;

-- GPUs each project's active tasks hold now, and its running jobs.
CREATE VIEW project_load AS
SELECT j.project_id, sum(j.gpus) AS gpus_in_use, count(DISTINCT j.id) AS running_jobs
FROM jobs j
JOIN tasks t ON t.job_id = j.id AND t.state IN ('assigned', 'running')
WHERE j.state = 'running'
GROUP BY j.project_id;

-- Each project's GPU quota and its use now: `borrowed` is what it holds beyond its nominal
-- quota (preemptible by a project within its own), `queued_tasks` what waits in task_queue.
CREATE VIEW project_quota_use AS
SELECT p.id AS project_id, p.name, p.gpu_quota AS nominal, p.gpu_borrow AS borrow, p.weight,
       coalesce(l.gpus_in_use, 0) AS gpus_in_use, coalesce(l.running_jobs, 0) AS running_jobs,
       CASE WHEN p.gpu_quota IS NULL THEN 0 ELSE max(coalesce(l.gpus_in_use, 0) - p.gpu_quota, 0) END AS borrowed,
       (SELECT coalesce(sum(g.queued), 0) FROM queue_groups g WHERE g.project_id = p.id) AS queued_tasks
FROM projects p
LEFT JOIN project_load l ON l.project_id = p.id;
