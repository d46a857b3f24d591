-- Version 8: a waiting multi-node job (gang) may preempt (issue 15). The room its victims free
-- on its W workers is held for it (gang_reservations) until it is placed or the hold expires,
-- so other work cannot take one worker's freed room while the others' victims still stop.
-- No view changes: acquire_task and gang_workers read the table by worker.

-- Room held for a waiting gang while the preemption victims that make it stop: a row per
-- worker chosen for one of its ranks, written in the preemption round that asked for the
-- victims (preemption.py). Until `expires_at` (the preemption grace plus two lease TTLs after
-- it), other work on that worker (acquire_task, another gang's gang_workers) takes only room
-- beyond it: a slot and the rank's GPUs, CPUs and memory. Deleted when the job leaves the queue
-- (placed or cancelled: the trigger below); an expired row counts for nothing and goes at the
-- next preemption round.
CREATE TABLE gang_reservations (
    worker_id    INTEGER NOT NULL,
    job_id       INTEGER NOT NULL,
    gpus         INTEGER NOT NULL CHECK (gpus >= 0),   -- one rank's
    cpus         REAL NOT NULL CHECK (cpus >= 0),
    memory_mb    INTEGER NOT NULL CHECK (memory_mb >= 0),
    reserved_at  REAL NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (worker_id, job_id)
) STRICT;
CREATE INDEX gang_reservations_job ON gang_reservations (job_id);

CREATE TRIGGER jobs_gang_reservations_end AFTER UPDATE OF state ON jobs
WHEN old.state = 'queued' AND new.state <> 'queued' AND new.gang = 1 BEGIN
    DELETE FROM gang_reservations WHERE job_id = new.id;
END;
