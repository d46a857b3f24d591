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
