-- Version 25: the task state machine in one place (issue 37). task_transitions lists every change of
-- tasks.state that an operation makes; the trigger tasks_transition refuses any other. The same for jobs:
-- job_transitions and jobs_transition.
-- The task state machine: every change of tasks.state that some operation makes, and which
-- (the named queries in gpulayer/server/store/queries/). tasks_transition refuses any other change
-- (RAISE ABORT 'task_transition: FROM -> TO', the statement undone); an update that keeps the state
-- passes. succeeded, failed, cancelled and lost are final: a new attempt is a new row. Ops read it:
-- SELECT * FROM task_transitions.
CREATE TABLE task_transitions (
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    made_by     TEXT NOT NULL,  -- the named queries that make it
    PRIMARY KEY (from_state, to_state)
) STRICT, WITHOUT ROWID;
INSERT INTO task_transitions (from_state, to_state, made_by) VALUES
    ('queued', 'assigned', 'acquire_task, acquire_one (a worker claims it), assign_task (a gang), lease_ahead (an element leased ahead)'),
    ('queued', 'cancelled', 'cancel_element, cancel_queued_batch (a user cancels), stop_attempt_tasks (a sibling ended it), detach_running_tasks (a retry replaces the attempt)'),
    ('assigned', 'queued', 'requeue_never_started, requeue_ahead, requeue_ahead_expired, requeue_preempted, requeue_drained_task, release_attempt'),
    ('assigned', 'running', 'start_task'),
    ('assigned', 'succeeded', 'finish_task (a finish that carries no start)'),
    ('assigned', 'failed', 'finish_task (it failed before its process started)'),
    ('assigned', 'cancelled', 'finish_task, cancel_element, cancel_queued_batch, stop_attempt_tasks, detach_running_tasks'),
    ('assigned', 'lost', 'finish_task (its worker stopped it), expire_task_leases, worker_tasks_lost'),
    ('running', 'queued', 'requeue_preempted, requeue_drained_task, release_attempt (a gang attempt goes back)'),
    ('running', 'succeeded', 'finish_task'),
    ('running', 'failed', 'finish_task'),
    ('running', 'cancelled', 'finish_task (a cancel or a requeue it obeyed), detach_running_tasks'),
    ('running', 'lost', 'finish_task (its worker stopped it, its GPU failed), lose_unreported_task, expire_task_leases, worker_tasks_lost');
-- RAISE takes a literal before SQLite 3.48 (the file stays readable by 3.40): the CASE names the
-- pair; the table alone says which pairs pass.
CREATE TRIGGER tasks_transition BEFORE UPDATE OF state ON tasks
WHEN new.state IS NOT old.state
     AND NOT EXISTS (SELECT 1 FROM task_transitions WHERE from_state = old.state AND to_state = new.state)
BEGIN
    SELECT CASE old.state || ' -> ' || new.state
        WHEN 'queued -> assigned' THEN RAISE(ABORT, 'task_transition: queued -> assigned')
        WHEN 'queued -> running' THEN RAISE(ABORT, 'task_transition: queued -> running')
        WHEN 'queued -> succeeded' THEN RAISE(ABORT, 'task_transition: queued -> succeeded')
        WHEN 'queued -> failed' THEN RAISE(ABORT, 'task_transition: queued -> failed')
        WHEN 'queued -> cancelled' THEN RAISE(ABORT, 'task_transition: queued -> cancelled')
        WHEN 'queued -> lost' THEN RAISE(ABORT, 'task_transition: queued -> lost')
        WHEN 'assigned -> queued' THEN RAISE(ABORT, 'task_transition: assigned -> queued')
        WHEN 'assigned -> running' THEN RAISE(ABORT, 'task_transition: assigned -> running')
        WHEN 'assigned -> succeeded' THEN RAISE(ABORT, 'task_transition: assigned -> succeeded')
        WHEN 'assigned -> failed' THEN RAISE(ABORT, 'task_transition: assigned -> failed')
        WHEN 'assigned -> cancelled' THEN RAISE(ABORT, 'task_transition: assigned -> cancelled')
        WHEN 'assigned -> lost' THEN RAISE(ABORT, 'task_transition: assigned -> lost')
        WHEN 'running -> queued' THEN RAISE(ABORT, 'task_transition: running -> queued')
        WHEN 'running -> assigned' THEN RAISE(ABORT, 'task_transition: running -> assigned')
        WHEN 'running -> succeeded' THEN RAISE(ABORT, 'task_transition: running -> succeeded')
        WHEN 'running -> failed' THEN RAISE(ABORT, 'task_transition: running -> failed')
        WHEN 'running -> cancelled' THEN RAISE(ABORT, 'task_transition: running -> cancelled')
        WHEN 'running -> lost' THEN RAISE(ABORT, 'task_transition: running -> lost')
        WHEN 'succeeded -> queued' THEN RAISE(ABORT, 'task_transition: succeeded -> queued')
        WHEN 'succeeded -> assigned' THEN RAISE(ABORT, 'task_transition: succeeded -> assigned')
        WHEN 'succeeded -> running' THEN RAISE(ABORT, 'task_transition: succeeded -> running')
        WHEN 'succeeded -> failed' THEN RAISE(ABORT, 'task_transition: succeeded -> failed')
        WHEN 'succeeded -> cancelled' THEN RAISE(ABORT, 'task_transition: succeeded -> cancelled')
        WHEN 'succeeded -> lost' THEN RAISE(ABORT, 'task_transition: succeeded -> lost')
        WHEN 'failed -> queued' THEN RAISE(ABORT, 'task_transition: failed -> queued')
        WHEN 'failed -> assigned' THEN RAISE(ABORT, 'task_transition: failed -> assigned')
        WHEN 'failed -> running' THEN RAISE(ABORT, 'task_transition: failed -> running')
        WHEN 'failed -> succeeded' THEN RAISE(ABORT, 'task_transition: failed -> succeeded')
        WHEN 'failed -> cancelled' THEN RAISE(ABORT, 'task_transition: failed -> cancelled')
        WHEN 'failed -> lost' THEN RAISE(ABORT, 'task_transition: failed -> lost')
        WHEN 'cancelled -> queued' THEN RAISE(ABORT, 'task_transition: cancelled -> queued')
        WHEN 'cancelled -> assigned' THEN RAISE(ABORT, 'task_transition: cancelled -> assigned')
        WHEN 'cancelled -> running' THEN RAISE(ABORT, 'task_transition: cancelled -> running')
        WHEN 'cancelled -> succeeded' THEN RAISE(ABORT, 'task_transition: cancelled -> succeeded')
        WHEN 'cancelled -> failed' THEN RAISE(ABORT, 'task_transition: cancelled -> failed')
        WHEN 'cancelled -> lost' THEN RAISE(ABORT, 'task_transition: cancelled -> lost')
        WHEN 'lost -> queued' THEN RAISE(ABORT, 'task_transition: lost -> queued')
        WHEN 'lost -> assigned' THEN RAISE(ABORT, 'task_transition: lost -> assigned')
        WHEN 'lost -> running' THEN RAISE(ABORT, 'task_transition: lost -> running')
        WHEN 'lost -> succeeded' THEN RAISE(ABORT, 'task_transition: lost -> succeeded')
        WHEN 'lost -> failed' THEN RAISE(ABORT, 'task_transition: lost -> failed')
        WHEN 'lost -> cancelled' THEN RAISE(ABORT, 'task_transition: lost -> cancelled')
        ELSE RAISE(ABORT, 'task_transition: not a task state')
    END;
END;
-- The job state machine, the same way: job_transitions lists every change of jobs.state that a
-- named query makes (finish_job's rows are what its WHERE admits: any of queued, running, waiting to
-- any end); jobs_transition refuses any other ('job_transition: FROM -> TO').
CREATE TABLE job_transitions (
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    made_by     TEXT NOT NULL,  -- the named queries that make it
    PRIMARY KEY (from_state, to_state)
) STRICT, WITHOUT ROWID;
INSERT INTO job_transitions (from_state, to_state, made_by) VALUES
    ('queued', 'waiting', 'hold_job (held before any task started)'),
    ('queued', 'running', 'mark_job_running, mark_jobs_running (a task was placed)'),
    ('running', 'queued', 'requeue_job_if_idle, requeue_job (no task holds a worker now), next_attempt (a retry)'),
    ('waiting', 'queued', 'release_job (its dependencies ended, its hold released, its begin time came)'),
    ('queued', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('succeeded', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('failed', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('cancelled', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('lost', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)');
CREATE TRIGGER jobs_transition BEFORE UPDATE OF state ON jobs
WHEN new.state IS NOT old.state
     AND NOT EXISTS (SELECT 1 FROM job_transitions WHERE from_state = old.state AND to_state = new.state)
BEGIN
    SELECT CASE old.state || ' -> ' || new.state
        WHEN 'queued -> running' THEN RAISE(ABORT, 'job_transition: queued -> running')
        WHEN 'queued -> succeeded' THEN RAISE(ABORT, 'job_transition: queued -> succeeded')
        WHEN 'queued -> failed' THEN RAISE(ABORT, 'job_transition: queued -> failed')
        WHEN 'queued -> cancelled' THEN RAISE(ABORT, 'job_transition: queued -> cancelled')
        WHEN 'queued -> lost' THEN RAISE(ABORT, 'job_transition: queued -> lost')
        WHEN 'queued -> waiting' THEN RAISE(ABORT, 'job_transition: queued -> waiting')
        WHEN 'running -> queued' THEN RAISE(ABORT, 'job_transition: running -> queued')
        WHEN 'running -> succeeded' THEN RAISE(ABORT, 'job_transition: running -> succeeded')
        WHEN 'running -> failed' THEN RAISE(ABORT, 'job_transition: running -> failed')
        WHEN 'running -> cancelled' THEN RAISE(ABORT, 'job_transition: running -> cancelled')
        WHEN 'running -> lost' THEN RAISE(ABORT, 'job_transition: running -> lost')
        WHEN 'running -> waiting' THEN RAISE(ABORT, 'job_transition: running -> waiting')
        WHEN 'succeeded -> queued' THEN RAISE(ABORT, 'job_transition: succeeded -> queued')
        WHEN 'succeeded -> running' THEN RAISE(ABORT, 'job_transition: succeeded -> running')
        WHEN 'succeeded -> failed' THEN RAISE(ABORT, 'job_transition: succeeded -> failed')
        WHEN 'succeeded -> cancelled' THEN RAISE(ABORT, 'job_transition: succeeded -> cancelled')
        WHEN 'succeeded -> lost' THEN RAISE(ABORT, 'job_transition: succeeded -> lost')
        WHEN 'succeeded -> waiting' THEN RAISE(ABORT, 'job_transition: succeeded -> waiting')
        WHEN 'failed -> queued' THEN RAISE(ABORT, 'job_transition: failed -> queued')
        WHEN 'failed -> running' THEN RAISE(ABORT, 'job_transition: failed -> running')
        WHEN 'failed -> succeeded' THEN RAISE(ABORT, 'job_transition: failed -> succeeded')
        WHEN 'failed -> cancelled' THEN RAISE(ABORT, 'job_transition: failed -> cancelled')
        WHEN 'failed -> lost' THEN RAISE(ABORT, 'job_transition: failed -> lost')
        WHEN 'failed -> waiting' THEN RAISE(ABORT, 'job_transition: failed -> waiting')
        WHEN 'cancelled -> queued' THEN RAISE(ABORT, 'job_transition: cancelled -> queued')
        WHEN 'cancelled -> running' THEN RAISE(ABORT, 'job_transition: cancelled -> running')
        WHEN 'cancelled -> succeeded' THEN RAISE(ABORT, 'job_transition: cancelled -> succeeded')
        WHEN 'cancelled -> failed' THEN RAISE(ABORT, 'job_transition: cancelled -> failed')
        WHEN 'cancelled -> lost' THEN RAISE(ABORT, 'job_transition: cancelled -> lost')
        WHEN 'cancelled -> waiting' THEN RAISE(ABORT, 'job_transition: cancelled -> waiting')
        WHEN 'lost -> queued' THEN RAISE(ABORT, 'job_transition: lost -> queued')
        WHEN 'lost -> running' THEN RAISE(ABORT, 'job_transition: lost -> running')
        WHEN 'lost -> succeeded' THEN RAISE(ABORT, 'job_transition: lost -> succeeded')
        WHEN 'lost -> failed' THEN RAISE(ABORT, 'job_transition: lost -> failed')
        WHEN 'lost -> cancelled' THEN RAISE(ABORT, 'job_transition: lost -> cancelled')
        WHEN 'lost -> waiting' THEN RAISE(ABORT, 'job_transition: lost -> waiting')
        WHEN 'waiting -> queued' THEN RAISE(ABORT, 'job_transition: waiting -> queued')
        WHEN 'waiting -> running' THEN RAISE(ABORT, 'job_transition: waiting -> running')
        WHEN 'waiting -> succeeded' THEN RAISE(ABORT, 'job_transition: waiting -> succeeded')
        WHEN 'waiting -> failed' THEN RAISE(ABORT, 'job_transition: waiting -> failed')
        WHEN 'waiting -> cancelled' THEN RAISE(ABORT, 'job_transition: waiting -> cancelled')
        WHEN 'waiting -> lost' THEN RAISE(ABORT, 'job_transition: waiting -> lost')
        ELSE RAISE(ABORT, 'job_transition: not a job state')
    END;
END;
