-- The queries of scheduler/chunks.py: array elements leased ahead, given back, and finishes in a batch.

-- name: ahead_jobs --
-- The array jobs whose elements the worker may be leased ahead: plain elements (no GPU nor share of one, not a gang,
-- a batch job, not being cancelled) of a running job it holds an element of, on a worker online,
-- not cordoned, and holding no room for a waiting gang; with how many it holds ahead of each.
-- (The redundant IN term lets SQLite use the partial index tasks_worker_active.)
SELECT t.job_id, w.slots, total(t.ahead) AS ahead
FROM tasks t JOIN jobs j ON j.id = t.job_id JOIN workers w ON w.id = t.worker_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND j.array_size IS NOT NULL AND j.gang = 0 AND j.gpus = 0 AND j.kind = 'batch'
  AND j.gpu_fraction IS NULL AND j.gpu_memory_mb IS NULL
  AND j.state = 'running' AND j.reason IS NULL AND w.state = 'online'
  AND NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id)
  AND NOT EXISTS (SELECT 1 FROM gang_reservations r WHERE r.worker_id = w.id AND r.expires_at > :now)
GROUP BY t.job_id ORDER BY t.job_id;

-- name: lease_ahead --
-- Lease up to :n of a job's queued elements (released from its %N cap: not held) to the worker,
-- first come, without starting them: `ahead` keeps them out of the worker's room (worker_load);
-- they count against the cap as any assigned element does (held ones are released only as
-- elements end).
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = (SELECT advertise_address FROM workers WHERE id = :worker_id), ahead = 1
WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_job_active
             WHERE job_id = :job_id AND state IN ('queued', 'assigned', 'running') AND state = 'queued'
               AND held = 0 AND cancel_requested = 0
             ORDER BY id LIMIT :n)
RETURNING id, job_id, "index", attempt;

-- name: ahead_held --
-- The elements leased ahead to the worker and not started (oldest first).
SELECT id FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND state = 'assigned' AND ahead = 1
ORDER BY id;

-- name: requeue_ahead --
-- Elements leased ahead to the worker and not started go back to the queue, same attempt: all of
-- them (:ids NULL: it leaves, is cordoned or drained) or those it gives back (:ids, a JSON array).
UPDATE tasks
SET state = 'queued', worker_id = NULL, lease_expires_at = NULL, assigned_at = NULL, address = NULL, ahead = 0
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND state = 'assigned' AND ahead = 1
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
RETURNING id, job_id;

-- name: requeue_ahead_expired --
-- Elements leased ahead whose lease passed (or whose worker's did) go back to the queue, same
-- attempt, before expire_task_leases loses what was started.
UPDATE tasks
SET state = 'queued', worker_id = NULL, lease_expires_at = NULL, assigned_at = NULL, address = NULL, ahead = 0
WHERE state IN ('assigned', 'running') AND state = 'assigned' AND ahead = 1
  AND (lease_expires_at < :now
       OR worker_id IN (SELECT id FROM workers WHERE state = 'online' AND lease_expires_at < :now))
RETURNING id, job_id, worker_id;

-- name: ahead_dropped --
-- Of the elements a worker says it holds leased ahead (:held, a JSON array of task ids), those it
-- may no longer start: not assigned to it any more (cancelled, given back, requeued) or to be cancelled.
SELECT h.value AS id FROM json_each(:held) h
WHERE NOT EXISTS (SELECT 1 FROM tasks t
                  WHERE t.id = h.value AND t.worker_id = :worker_id AND t.state = 'assigned'
                    AND t.cancel_requested = 0);
