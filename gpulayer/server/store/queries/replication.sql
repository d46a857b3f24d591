-- The queries of server/replication/ (restore.py): what a restored state file holds.

-- name: restored_summary --
-- What a restored state file holds: its jobs, its newest task id (the reconciliation
-- watermark: a task id above it was made after the restore), its last event's time.
SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT COALESCE(max(id), 0) FROM tasks) AS max_task_id,
       (SELECT max(at) FROM events) AS last_event_at;
