-- The queries of server/process.py: what a backup holds.

-- name: count_jobs --
-- Jobs in a state file (a backup reports what it holds).
SELECT count(*) AS n FROM jobs;
