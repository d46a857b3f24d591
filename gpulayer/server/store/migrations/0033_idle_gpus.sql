-- Version 33: idle GPUs taken back (issue 40, point 2; docs/workers.md "Idle GPUs"). A project may set an
-- idle policy (`project set --idle-timeout 30m --idle-below 5% --idle-action requeue`): its columns below,
-- NULL where the project leaves it to the fleet default (`server start --idle-timeout ...`); a job's own
-- (JobSpec idle_*) come first. A task requeued for being idle goes through preemption (reason 'idle',
-- for_task_id its own id: it makes room for nobody in particular), so the preemptions table is rebuilt
-- with that reason. idle_reclaims holds what the idle check did to a task's assignment: warned (work with
-- a shell or SSH session open is warned first), notified, requeued or cancelled; each once per assignment.
ALTER TABLE projects ADD COLUMN idle_timeout_s REAL CHECK (idle_timeout_s IS NULL OR idle_timeout_s > 0);
ALTER TABLE projects ADD COLUMN idle_below_pct REAL CHECK (idle_below_pct IS NULL OR idle_below_pct BETWEEN 0 AND 100);
ALTER TABLE projects ADD COLUMN idle_action TEXT CHECK (idle_action IS NULL OR idle_action IN ('notify', 'requeue', 'cancel'));

ALTER TABLE preemptions RENAME TO preemptions_v34;
DROP INDEX preemptions_task;
DROP INDEX preemptions_for;
DROP INDEX preemptions_worker;
CREATE TABLE preemptions (
    id            INTEGER PRIMARY KEY,
    task_id       INTEGER NOT NULL,
    job_id        INTEGER NOT NULL,
    worker_id     INTEGER NOT NULL,
    for_task_id   INTEGER NOT NULL,
    for_job_id    INTEGER NOT NULL,
    reason        TEXT NOT NULL CHECK (reason IN (
                      'priority',  -- preemptible work of a lower priority
                      'borrowed',  -- work over its project's nominal quota, for a project within its own
                      'idle'       -- its GPUs idle past its idle policy (for_task_id: itself)
                  )),
    asked_at      REAL NOT NULL,
    done_at       REAL
) STRICT;
INSERT INTO preemptions (id, task_id, job_id, worker_id, for_task_id, for_job_id, reason, asked_at, done_at)
SELECT id, task_id, job_id, worker_id, for_task_id, for_job_id, reason, asked_at, done_at FROM preemptions_v34;
DROP TABLE preemptions_v34;
CREATE INDEX preemptions_task ON preemptions (task_id, done_at);
CREATE INDEX preemptions_for ON preemptions (for_task_id) WHERE done_at IS NULL;
CREATE INDEX preemptions_worker ON preemptions (worker_id) WHERE done_at IS NULL;

CREATE TABLE idle_reclaims (
    id           INTEGER PRIMARY KEY,
    task_id      INTEGER NOT NULL,
    job_id       INTEGER NOT NULL,
    assigned_at  REAL NOT NULL,   -- the task's assignment it is about (a requeued task is judged afresh)
    action       TEXT NOT NULL CHECK (action IN ('warn', 'notify', 'requeue', 'cancel')),
    at           REAL NOT NULL
) STRICT;
CREATE INDEX idle_reclaims_task ON idle_reclaims (task_id, assigned_at);
