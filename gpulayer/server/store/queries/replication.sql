-- The queries of server/replication/ (restore.py): what a restored state file holds, and its first start.

-- name: restored_summary --
-- What a restored state file holds: its jobs, its newest task id (the reconciliation
-- watermark: a task id above it was made after the restore), its last event's time.
SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT COALESCE(max(id), 0) FROM tasks) AS max_task_id,
       (SELECT max(at) FROM events) AS last_event_at;

-- name: seed_event_sequence --
-- The row of sqlite_sequence that keeps the next event seq, for a file that never had an event.
INSERT INTO sqlite_sequence (name, seq)
SELECT 'events', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'events');

-- name: skip_lost_event_seqs --
-- The first start of a restored home: the next event seq jumps by :skip, past the seqs the old control
-- plane gave the events of the lost window (what the replica had not received), so no event of the
-- restored plane takes one, and a `webhook-id` (msg_gl<webhook>e<seq>) a receiver had is not sent again.
UPDATE sqlite_sequence SET seq = seq + :skip WHERE name = 'events' RETURNING seq;
