-- The queries of scheduler/cadence.py: the heartbeat interval scaled with the online fleet.

-- name: online_workers_count --
-- The fleet the heartbeat interval is scaled for, read once per upkeep tick and at start-up.
SELECT count(*) AS n FROM workers WHERE state = 'online';
