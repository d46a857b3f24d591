-- The queries of scheduler/leases.py: heartbeats, lease expiry, stale gangs, the grace after a restart.

-- name: renew_worker --
-- A heartbeat: the worker's lease moves on; an offline worker comes back.
UPDATE workers
SET last_seen_at = :now, lease_expires_at = :lease_expires_at,
    state = CASE WHEN state = 'offline' THEN 'online' ELSE state END
WHERE id = :worker_id
RETURNING state, gone_reason;

-- name: renew_task_leases --
-- A heartbeat renews the lease of every task the worker holds.
UPDATE tasks SET lease_expires_at = :lease_expires_at
WHERE worker_id = :worker_id AND state IN ('assigned', 'running');

-- name: report_task --
-- Store a replica's endpoint and restart count as the worker reports them; a row back means a change.
UPDATE tasks SET endpoint = :endpoint, restarts = :restarts
WHERE id = :task_id AND worker_id = :worker_id AND state = 'running'
  AND (endpoint IS NOT :endpoint OR restarts <> :restarts)
RETURNING id, job_id, endpoint, restarts;

-- name: worker_active_tasks --
-- What the control plane thinks this worker holds, what it wants cancelled, and each one's time limit now
-- (`job update --time` changes it for a running attempt too).
SELECT t.id, t.cancel_requested, json_extract(j.spec, '$.timeout_seconds') AS timeout_seconds
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running');

-- name: expire_task_leases --
-- Tasks whose lease passed are lost, and so are those of a worker whose own
-- lease passed: a task acquired after the worker's last heartbeat has a later
-- lease, which must not outlive the worker (it goes offline just after).
UPDATE tasks SET state = 'lost', reason = 'worker_lost', finished_at = :now, endpoint = NULL
WHERE state IN ('assigned', 'running')
  AND (lease_expires_at < :now
       OR worker_id IN (SELECT id FROM workers WHERE state = 'online' AND lease_expires_at < :now))
RETURNING id, job_id, attempt, worker_id;

-- name: expire_workers --
-- Workers whose lease passed go offline (they keep their session token).
UPDATE workers SET state = 'offline'
WHERE state = 'online' AND lease_expires_at < :now
RETURNING id, name;

-- name: stale_gang_tasks --
-- Gang ranks assigned but not started within the start timeout.
SELECT DISTINCT t.job_id, t.attempt
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'assigned' AND j.gang = 1 AND t.assigned_at < :deadline;

-- name: release_attempt --
-- Put every active rank of a gang attempt back in the queue, holding nothing.
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL, ahead = 0,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('assigned', 'running')
RETURNING id, worker_id;

-- name: clear_rendezvous --
-- Forget the arrivals of a released gang attempt.
DELETE FROM rendezvous WHERE job_id = :job_id AND attempt = :attempt;

-- name: worker_tasks_lost --
-- What a departing worker held ends as lost, for the retry policy to judge.
UPDATE tasks SET state = 'lost', reason = :reason, finished_at = :now, endpoint = NULL
WHERE worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt;

-- name: requeue_job --
-- A released gang waits in the queue again.
UPDATE jobs SET state = 'queued' WHERE id = :job_id AND state = 'running';

-- name: worker_state --
-- A worker's state before a change.
SELECT state, gone_reason FROM workers WHERE id = :worker_id;

-- name: grace_task_leases --
-- After the control plane was down, live task leases run at least until :until,
-- so workers that kept running get a heartbeat interval or two to report in.
UPDATE tasks SET lease_expires_at = max(lease_expires_at, :until)
WHERE state IN ('assigned', 'running') AND lease_expires_at < :until
RETURNING id;

-- name: grace_worker_leases --
-- The same grace for the leases of online workers.
UPDATE workers SET lease_expires_at = max(coalesce(lease_expires_at, 0), :until)
WHERE state = 'online' AND coalesce(lease_expires_at, 0) < :until
RETURNING id;

-- name: heartbeat_view --
-- A heartbeat's read, one statement (one snapshot): the worker's state, its GPUs as stored, and what it
-- holds, as a write would compare them with what it reports (and each task's time limit now).
SELECT w.state,
       (SELECT json_group_array(json_array(g."index", g.uuid, g.healthy, g.reset_pending))
        FROM worker_gpus g WHERE g.worker_id = w.id) AS gpus,
       (SELECT json_group_array(json_array(t.id, t.state, t.cancel_requested, t.endpoint, t.restarts,
                                           json_extract(j.spec, '$.timeout_seconds')))
        FROM tasks t JOIN jobs j ON j.id = t.job_id
        WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')) AS tasks
FROM workers w WHERE w.id = :worker_id;
