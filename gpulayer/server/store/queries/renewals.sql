-- The queries of scheduler/renewals.py: lease renewals noted in memory, written by upkeep in one statement each.

-- name: flush_worker_renewals --
-- Renewals noted in memory (renewals.py), in one statement: :renewals is {"worker id": seen at}.
-- A lease only moves on (max): a write-path heartbeat or the grace after a restart may be later.
UPDATE workers
SET last_seen_at = max(last_seen_at, r.value),
    lease_expires_at = max(coalesce(lease_expires_at, 0), r.value + :lease_ttl_s)
FROM json_each(:renewals) AS r
WHERE workers.id = CAST(r.key AS INTEGER) AND workers.state = 'online';

-- name: flush_task_renewals --
-- The same for the tasks those workers hold.
UPDATE tasks
SET lease_expires_at = r.value + :lease_ttl_s
FROM json_each(:renewals) AS r
WHERE tasks.worker_id = CAST(r.key AS INTEGER) AND tasks.state IN ('assigned', 'running')
  AND tasks.lease_expires_at < r.value + :lease_ttl_s;

-- name: flush_offline_renewals --
-- A worker gone offline that made a request since (a parked acquire, a finish): online again, as a
-- heartbeat would bring it back; only a request made after it went offline (seen after its lease).
UPDATE workers
SET state = 'online', last_seen_at = r.value, lease_expires_at = r.value + :lease_ttl_s
FROM json_each(:renewals) AS r
WHERE workers.id = CAST(r.key AS INTEGER) AND workers.state = 'offline'
  AND r.value > coalesce(workers.lease_expires_at, 0)
RETURNING workers.id;
