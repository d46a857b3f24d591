-- Queries of scheduler/policy_replay.py: `gpulayer policy replay`, the recorded jobs of a window re-run
-- on in-memory copies of the state file (docs/scheduling-time.md, "Replaying a policy change").

-- name: replay_projects --
-- Every project's name (a --set quota.NAME or weight.NAME must name one).
SELECT name FROM projects ORDER BY name;

-- name: replay_recorded --
-- The batch jobs submitted in [:since, :until], oldest first: their spec and owner, their longest ended
-- run in the usage ledger (ran_s), the longest run still going at :until (running_s), their first start.
SELECT j.id, j.name, j.spec, j.user_id, j.project_id, p.name AS project, j.gpus, j.created_at,
       (SELECT max(u.ended_at - u.started_at) FROM usage u WHERE u.job_id = j.id) AS ran_s,
       (SELECT max(:until - t.started_at) FROM tasks t
        WHERE t.job_id = j.id AND t.state = 'running') AS running_s,
       (SELECT min(t.started_at) FROM tasks t WHERE t.job_id = j.id) AS started_at
FROM jobs j JOIN projects p ON p.id = j.project_id
WHERE j.kind = 'batch' AND j.created_at BETWEEN :since AND :until
ORDER BY j.created_at, j.id;

-- name: replay_tables --
-- The tables of the copy (those the replay empties are named in policy_replay.CLEARED).
SELECT name FROM sqlite_master WHERE type = 'table';

-- name: replay_workers --
-- The workers of the window online in the copy (the latest row of each name registered by :until and
-- seen since :since, or online now), with leases that never expire; the others gone.
UPDATE workers SET state = CASE WHEN id IN (
           SELECT max(id) FROM workers WHERE registered_at <= :until
             AND (state = 'online' OR last_seen_at >= :since) GROUP BY name)
         THEN 'online' ELSE 'gone' END,
       gone_reason = coalesce(gone_reason, 'not in the replayed window'),
       lease_expires_at = CASE WHEN id IN (
           SELECT max(id) FROM workers WHERE registered_at <= :until
             AND (state = 'online' OR last_seen_at >= :since) GROUP BY name) THEN :forever END,
       last_seen_at = :since;

-- name: replay_capacity --
-- The online workers of the copy and their GPUs.
SELECT count(*) AS n, total(gpus) AS g FROM workers WHERE state = 'online';

-- name: replay_set_quota --
UPDATE projects SET gpu_quota = :value WHERE name = :name;

-- name: replay_set_weight --
UPDATE projects SET weight = :value WHERE name = :name;

-- name: replay_set_backfill --
UPDATE scheduler_settings SET backfill = :value;

-- name: replay_set_backfill_depth --
UPDATE scheduler_settings SET backfill_depth = :value;

-- name: replay_set_fairshare_half_life --
UPDATE scheduler_settings SET fairshare_half_life_s = :value;

-- name: replay_gpu_use --
-- Every run's job, GPUs and span, by project: the ledger's, and those still running (to :until).
SELECT u.job_id, coalesce(p.name, u.project_name, '?') AS project, u.gpus, u.started_at, u.ended_at
FROM usage u LEFT JOIN projects p ON p.id = u.project_id
UNION ALL
SELECT t.job_id, p.name, j.gpus, t.started_at, :until FROM tasks t JOIN jobs j ON j.id = t.job_id
JOIN projects p ON p.id = j.project_id WHERE t.state = 'running';
