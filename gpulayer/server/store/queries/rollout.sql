-- The queries of scheduler/rollout.py: a service's revisions and the rollout that replaces its replicas.

-- name: rollout_job --
-- The job a `service update` (promote, rollback) names, with its serving revision and spec.
SELECT id, state, kind, width, attempt, priority, revision, spec, reason FROM jobs WHERE id = :job_id;

-- name: active_update --
-- The job's rollout under way (rolling or rolling back), if any.
SELECT * FROM service_updates WHERE job_id = :job_id AND state IN ('rolling', 'rolling_back');

-- name: active_updates --
-- Every rollout under way, oldest first: what upkeep's rollout step drives.
SELECT * FROM service_updates WHERE state IN ('rolling', 'rolling_back') ORDER BY created_at, job_id;

-- name: any_update_active --
-- Is any rollout under way (upkeep writes nothing when none is)?
SELECT 1 AS found FROM service_updates WHERE state IN ('rolling', 'rolling_back') LIMIT 1;

-- name: next_ready_deadline --
-- The soonest readiness deadline of a rolling rollout's new replicas that run and are not ready yet (their start
-- plus the rollout's ready_timeout_s): upkeep's next tick comes then, not at its interval (a failed rollout turns
-- around at its deadline).
SELECT min(t.started_at + u.ready_timeout_s) AS due
FROM service_updates u JOIN jobs j ON j.id = u.job_id
JOIN tasks t ON t.job_id = u.job_id AND t.attempt = j.attempt AND t.revision = u.revision
WHERE u.state = 'rolling' AND t.state = 'running' AND t.endpoint IS NULL AND t.drain_deadline IS NULL
  AND t.started_at IS NOT NULL;

-- name: next_revision --
-- The number a new revision of the job takes: after its serving one and every revision tried before.
SELECT max(j.revision, coalesce((SELECT max(revision) FROM service_updates WHERE job_id = j.id), 1)) + 1 AS n
FROM jobs j WHERE j.id = :job_id;

-- name: insert_update --
-- A `service update`: its new revision's spec and how it rolls out.
INSERT INTO service_updates (job_id, revision, from_revision, spec, changes, state, max_surge, max_unavailable,
                             canary, ready_timeout_s, drain_s, created_at)
VALUES (:job_id, :revision, :from_revision, :spec, :changes, 'rolling', :max_surge, :max_unavailable,
        :canary, :ready_timeout_s, :drain_s, :now)
RETURNING *;

-- name: rollout_tasks --
-- The replicas of the job's current attempt not ended: what a rollout step counts (draining ones apart).
SELECT t.id, t."index" AS "index", t.state, t.revision, t.endpoint, t.restarts, t.started_at, t.assigned_at,
       t.created_at, t.cancel_requested, t.drain_deadline
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.attempt = j.attempt AND t.state IN ('queued', 'assigned', 'running')
ORDER BY t."index", t.id;

-- name: insert_revision_task --
-- One queued replica of a given revision (a rollout's surge, or the old revision's while rolling back).
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at, revision)
VALUES (:job_id, :index, :attempt, 'queued', :priority, :now, :revision)
RETURNING id;

-- name: set_update_state --
-- A rollout's next state (rolling_back with its reason; finished, rolled_back or ended with the time).
UPDATE service_updates
SET state = :state, reason = coalesce(:reason, reason),
    finished_at = CASE WHEN :state IN ('finished', 'rolled_back', 'ended') THEN :now ELSE NULL END
WHERE job_id = :job_id AND revision = :revision AND state IN ('rolling', 'rolling_back')
RETURNING *;

-- name: promote_update --
-- `service promote`: a canary's rollout goes on to every replica.
UPDATE service_updates SET promoted_at = :now
WHERE job_id = :job_id AND revision = :revision AND state = 'rolling' AND promoted_at IS NULL
RETURNING *;

-- name: serve_revision --
-- A finished rollout: the job serves its new revision (its spec is the one retries and replacements run).
UPDATE jobs SET revision = :revision, spec = :spec WHERE id = :job_id;

-- name: revision_ended_task --
-- Did a replica of the revision end by itself (failed: exited, crashed past its restarts) since the rollout
-- began? Stops it asked for (cancelled) and lost workers are not the revision's fault.
SELECT id, reason, exit_code FROM tasks
WHERE job_id = :job_id AND revision = :revision AND state = 'failed' AND finished_at >= :since
ORDER BY id LIMIT 1;

-- name: update_history --
-- A service's updates, newest first (GET /v1/jobs/{id}/service).
SELECT revision, from_revision, state, changes, max_surge, max_unavailable, canary, ready_timeout_s, drain_s,
       reason, created_at, promoted_at, finished_at
FROM service_updates WHERE job_id = :job_id ORDER BY revision DESC LIMIT :limit;

-- name: revision_counts --
-- How many replicas of each revision the job's current attempt runs (not ended), how many serve (in the
-- ingress's set) and how many drain (leaving it).
SELECT t.revision, count(*) AS replicas,
       sum(t.state = 'running' AND t.endpoint IS NOT NULL AND t.drain_deadline IS NULL) AS ready,
       sum(t.drain_deadline IS NOT NULL) AS draining
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.attempt = j.attempt AND t.state IN ('queued', 'assigned', 'running')
GROUP BY t.revision ORDER BY t.revision;

-- name: task_revision --
-- The revision a replica runs.
SELECT revision FROM tasks WHERE id = :task_id;
