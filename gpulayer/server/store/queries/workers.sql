-- The queries of scheduler/workers.py: register, deregister, revoke, list workers.

-- name: register_worker --
-- A new worker row with its hashed session token.
INSERT INTO workers (name, state, labels, token_labels, cpus, gpus, memory_mb, gpu_models, slots,
                     advertise_address, version, protocol, session_hash, token_jti,
                     registered_at, last_seen_at, lease_expires_at, isolation, relay, gpu_sharing, gpu_memory_mb,
                     gpu_topology, gpu_nvlink)
VALUES (:name, 'online', :labels, :token_labels, :cpus, :gpus, :memory_mb, :gpu_models, :slots,
        :advertise_address, :version, :protocol, :session_hash, :token_jti,
        :now, :now, :lease_expires_at, :isolation, :relay, :gpu_sharing, :gpu_memory_mb, :gpu_topology, :gpu_nvlink)
RETURNING id;

-- name: online_worker_named --
-- An online worker with this name, if any (a new one with the same name is warned).
SELECT id FROM workers WHERE name = :name AND state = 'online' ORDER BY id LIMIT 1;

-- name: mark_needs_upgrade --
-- A worker refused for another protocol is listed until it registers again.
INSERT INTO workers (name, state, labels, version, protocol, token_jti, registered_at, last_seen_at)
VALUES (:name, 'needs_upgrade', '{}', :version, :protocol, :token_jti, :now, :now);

-- name: clear_needs_upgrade --
-- A worker of that name registered with the right protocol (or the server restarted).
UPDATE workers SET state = 'gone', gone_reason = :reason
WHERE state = 'needs_upgrade' AND (:name IS NULL OR name = :name);

-- name: worker_gone --
-- Deregistered or revoked: the worker never comes back.
UPDATE workers SET state = 'gone', gone_reason = :reason, lease_expires_at = NULL
WHERE id = :worker_id AND state <> 'gone'
RETURNING id;

-- name: workers_of_token --
-- The live workers that registered with a join token.
SELECT id FROM workers WHERE token_jti = :jti AND state IN ('online', 'offline');

-- name: list_workers --
-- Workers with what is free on them, and whether they are cordoned: after the id :after, at most :limit (-1: all).
SELECT wl.*, w.gpu_models, w.gpu_memory_mb, w.advertise_address, w.version, w.registered_at, w.gone_reason, w.isolation,
       c.state AS cordon, c.reason AS cordon_reason, c.since AS cordoned_at, c.deadline AS drain_deadline,
       (SELECT json_group_array(json_object('index', g."index", 'uuid', g.uuid,
                                            'healthy', json(CASE WHEN g.healthy THEN 'true' ELSE 'false' END),
                                            'reason', g.reason))
        FROM worker_gpus g WHERE g.worker_id = wl.worker_id) AS gpu_health
FROM worker_load wl JOIN workers w ON w.id = wl.worker_id
LEFT JOIN worker_cordons c ON c.worker_id = wl.worker_id
WHERE (:include_gone OR wl.state <> 'gone') AND wl.worker_id > :after
ORDER BY wl.worker_id LIMIT :limit;

-- name: revoke_token --
-- Revoke a token once.
UPDATE tokens SET revoked_at = :now WHERE jti = :jti AND revoked_at IS NULL RETURNING jti, kind;

-- name: requeue_never_started --
-- A worker that deregisters reported every task it launched first: those still only
-- assigned never ran there and go back to the queue, same attempt (not for gangs,
-- which are placed whole).
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL, ahead = 0,
    address = NULL
WHERE worker_id = :worker_id AND state = 'assigned'
  AND job_id IN (SELECT id FROM jobs WHERE gang = 0)
RETURNING id, job_id;

-- name: requeue_job_if_idle --
-- A running job whose tasks all went back to the queue is queued again.
UPDATE jobs SET state = 'queued'
WHERE id = :job_id AND state = 'running'
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE job_id = :job_id AND state IN ('assigned', 'running'))
RETURNING id;

-- name: carry_cordon --
-- A worker registering under a name whose newest earlier registration was cordoned stays out of
-- service: the cordon is copied (cordoned stays cordoned; draining or drained is drained, as the
-- new registration holds no task).
INSERT INTO worker_cordons (worker_id, state, reason, since, deadline, drained_at)
SELECT :worker_id, CASE WHEN c.state = 'cordoned' THEN 'cordoned' ELSE 'drained' END, c.reason, c.since, NULL,
       CASE WHEN c.state = 'cordoned' THEN NULL ELSE :now END
FROM worker_cordons c
WHERE c.worker_id = (SELECT max(id) FROM workers
                     WHERE name = :name AND id <> :worker_id AND state <> 'needs_upgrade')
RETURNING state, reason, (SELECT max(id) FROM workers
                          WHERE name = :name AND id <> :worker_id AND state <> 'needs_upgrade') AS from_worker;
