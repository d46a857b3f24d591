-- The queries of scheduler/events.py: the event log.

-- name: insert_event --
-- Append one event; written in the transaction of the change it records.
INSERT INTO events (at, kind, job_id, task_id, worker_id, data, actor)
VALUES (:now, :kind, :job_id, :task_id, :worker_id, :data, :actor);
