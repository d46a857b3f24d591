-- Version 3: queued work grouped by shape (shapes, task_queue, kept by triggers), so that
-- acquire's cost does not grow with queued tasks the worker cannot take; fit is written
-- once, for shapes (shape_worker_fit), and job_worker_fit reads it through each job's shape.

-- Queued work grouped by what it asks of a worker (HTCondor's autoclusters), so that
-- acquire judges the few shapes a worker fits instead of every queued task. One row per
-- distinct requirement, made when the first job asking for it is submitted (trigger
-- jobs_shape) and kept: job_worker_fit reads every job's fit through its shape.
CREATE TABLE shapes (
    id           INTEGER PRIMARY KEY,
    gang         INTEGER NOT NULL CHECK (gang IN (0, 1)),
    gpus         INTEGER NOT NULL CHECK (gpus >= 0),
    cpus         REAL NOT NULL CHECK (cpus >= 0),
    memory_mb    INTEGER NOT NULL CHECK (memory_mb >= 0),
    accelerator  TEXT NOT NULL CHECK (accelerator IN ('', 'cuda')),  -- '' for none: NULLs are never equal in UNIQUE
    labels       TEXT NOT NULL CHECK (json_valid(labels)),
    secrets      TEXT NOT NULL CHECK (json_valid(secrets)),
    queued       INTEGER NOT NULL DEFAULT 0 CHECK (queued >= 0),     -- its rows in task_queue
    UNIQUE (gang, gpus, cpus, memory_mb, accelerator, labels, secrets)
) STRICT;
-- Acquire looks only at shapes with queued tasks.
CREATE INDEX shapes_queued ON shapes (id) WHERE queued > 0;

-- The queued tasks by shape, best first: a row exactly while its task is queued, kept by
-- the triggers below in the statement that queues or dequeues the task.
CREATE TABLE task_queue (
    task_id   INTEGER PRIMARY KEY REFERENCES tasks (id),
    shape_id  INTEGER NOT NULL REFERENCES shapes (id),
    job_id    INTEGER NOT NULL,
    priority  INTEGER NOT NULL                      -- the task's (set at insert, never changed)
) STRICT;
CREATE INDEX task_queue_shape ON task_queue (shape_id, priority DESC, task_id);

CREATE TRIGGER jobs_shape AFTER INSERT ON jobs BEGIN
    INSERT OR IGNORE INTO shapes (gang, gpus, cpus, memory_mb, accelerator, labels, secrets)
    VALUES (new.gang, new.gpus, new.cpus, new.memory_mb, coalesce(new.accelerator, ''), new.labels, new.secrets);
END;
CREATE TRIGGER tasks_queued_insert AFTER INSERT ON tasks WHEN new.state = 'queued' BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority)
    SELECT new.id, js.shape_id, new.job_id, new.priority FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_queued_again AFTER UPDATE OF state ON tasks
WHEN new.state = 'queued' AND old.state <> 'queued' BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority)
    SELECT new.id, js.shape_id, new.job_id, new.priority FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_dequeued AFTER UPDATE OF state ON tasks
WHEN old.state = 'queued' AND new.state <> 'queued' BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;
CREATE TRIGGER tasks_queued_delete AFTER DELETE ON tasks WHEN old.state = 'queued' BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;
CREATE TRIGGER task_queue_count_in AFTER INSERT ON task_queue BEGIN
    UPDATE shapes SET queued = queued + 1 WHERE id = new.shape_id;
END;
CREATE TRIGGER task_queue_count_out AFTER DELETE ON task_queue BEGIN
    UPDATE shapes SET queued = queued - 1 WHERE id = old.shape_id;
END;

DROP VIEW job_worker_fit;

-- The shape of each job (shapes: the requirement its placement reads).
CREATE VIEW job_shape AS
SELECT j.id AS job_id, j.state AS job_state, s.id AS shape_id
FROM jobs j
JOIN shapes s ON s.gang = j.gang AND s.gpus = j.gpus AND s.cpus = j.cpus AND s.memory_mb = j.memory_mb
             AND s.accelerator = coalesce(j.accelerator, '') AND s.labels = j.labels AND s.secrets = j.secrets;

-- Which workers a shape of work fits, and why not: the one definition of fit, which
-- job_worker_fit reads for jobs and acquisition for queued shapes. One row per shape and
-- worker, whatever the worker's state. Flags are 0 or 1:
--   has_labels       every label the shape asks for is on the worker, with the same value
--   has_accelerator  the shape asks for none, or the worker has GPUs
--   big_enough       the worker's GPUs, CPUs and memory cover one task, when idle
--   missing_secret   the first of the shape's secrets (by name) that is not set or whose labels
--                    the worker's join token does not all carry; NULL when it may have them all
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
               SELECT sv.value FROM json_each(s.secrets) sv
               LEFT JOIN secrets sc ON sc.name = sv.value
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

-- An upgraded file: every job's shape (in the order of the jobs first asking for it), and
-- its queued tasks (the trigger task_queue_count_in counts them).
INSERT OR IGNORE INTO shapes (gang, gpus, cpus, memory_mb, accelerator, labels, secrets)
SELECT gang, gpus, cpus, memory_mb, coalesce(accelerator, ''), labels, secrets FROM jobs ORDER BY id;
INSERT INTO task_queue (task_id, shape_id, job_id, priority)
SELECT t.id, js.shape_id, t.job_id, t.priority
FROM tasks t INDEXED BY tasks_queued JOIN job_shape js ON js.job_id = t.job_id
WHERE t.state = 'queued';
