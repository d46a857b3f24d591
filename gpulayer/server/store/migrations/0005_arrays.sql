-- Version 5: job arrays and dependencies (issue 16). Jobs gain `array_size` and
-- `max_running` (an array's %N) and the state `waiting` (dependencies not ended); tasks gain
-- `held` (queued but not released, so outside task_queue: the queue triggers are made again
-- to skip held tasks); job_dependencies records `after`; job_worker_fit lets an array's
-- elements share a worker (holds_task is never true for an array).

-- `waiting` joins the jobs' state CHECK. Rebuilding the table would have to name every
-- column of it, the ones other versions add included; widening a CHECK changes no stored
-- row, which SQLite documents may be done by editing the table's text in sqlite_schema
-- (https://sqlite.org/lang_altertable.html, "Making Other Kinds Of Table Schema Changes").
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''lost''        -- a task was lost and is not retried',
                  '''lost'',       -- a task was lost and is not retried
                          ''waiting''     -- its dependencies (job_dependencies) have not all ended; tasks held')
WHERE type = 'table' AND name = 'jobs';
PRAGMA writable_schema = RESET;

ALTER TABLE jobs ADD COLUMN array_size INTEGER CHECK (array_size IS NULL OR array_size >= 1);
ALTER TABLE jobs ADD COLUMN max_running INTEGER CHECK (max_running IS NULL OR max_running >= 1);
ALTER TABLE tasks ADD COLUMN held INTEGER NOT NULL DEFAULT 0 CHECK (held IN (0, 1));

-- The next held task of a job to release (an array below its cap, a job whose dependencies ended).
CREATE INDEX tasks_held ON tasks (job_id, "index") WHERE state = 'queued' AND held = 1;
-- Has a job any task left to run (an array ends when none is left: one probe, not a walk of its
-- elements), and which of its tasks hold a worker (a seek per state, not a walk of what waits)?
CREATE INDEX tasks_job_active ON tasks (job_id, state) WHERE state IN ('queued', 'assigned', 'running');

CREATE TABLE job_dependencies (
    job_id        INTEGER NOT NULL REFERENCES jobs (id),
    after_job_id  INTEGER NOT NULL REFERENCES jobs (id),
    condition     TEXT NOT NULL CHECK (condition IN (
                      'ok',      -- after_job_id succeeded
                      'notok',   -- it failed, was lost or was cancelled
                      'any'      -- it ended, however
                  )),
    PRIMARY KEY (job_id, after_job_id)
) STRICT;
-- The jobs waiting on a job that just ended.
CREATE INDEX job_dependencies_after ON job_dependencies (after_job_id);

DROP TRIGGER tasks_queued_insert;
DROP TRIGGER tasks_queued_again;
DROP TRIGGER tasks_dequeued;
DROP TRIGGER tasks_queued_delete;
CREATE TRIGGER tasks_queued_insert AFTER INSERT ON tasks WHEN new.state = 'queued' AND new.held = 0 BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority)
    SELECT new.id, js.shape_id, new.job_id, new.priority FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_queued_again AFTER UPDATE OF state, held ON tasks
WHEN new.state = 'queued' AND new.held = 0 AND NOT (old.state = 'queued' AND old.held = 0) BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority)
    SELECT new.id, js.shape_id, new.job_id, new.priority FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_dequeued AFTER UPDATE OF state, held ON tasks
WHEN old.state = 'queued' AND old.held = 0 AND NOT (new.state = 'queued' AND new.held = 0) BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;
CREATE TRIGGER tasks_queued_delete AFTER DELETE ON tasks WHEN old.state = 'queued' AND old.held = 0 BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;

DROP VIEW job_worker_fit;
CREATE VIEW job_worker_fit AS
SELECT p.job_id, p.job_state, p.worker_id, p.worker_state, p.has_labels, p.has_accelerator,
       p.big_enough, p.missing_secret, p.has_room, p.holds_task, p.spare_gpus, p.fits,
       (p.shape_fits_now AND NOT p.holds_task) AS fits_now
FROM (
    SELECT js.job_id, js.job_state, f.worker_id, f.worker_state, f.has_labels, f.has_accelerator,
           f.big_enough, f.missing_secret, f.has_room, f.spare_gpus, f.fits, f.fits_now AS shape_fits_now,
           (EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's (an array's many)
                    WHERE o.worker_id = f.worker_id AND +o.job_id = js.job_id
                      AND o.state IN ('assigned', 'running'))
            AND (SELECT a.array_size FROM jobs a WHERE a.id = js.job_id) IS NULL) AS holds_task
    FROM job_shape js
    JOIN shape_worker_fit f ON f.shape_id = js.shape_id
) p;
