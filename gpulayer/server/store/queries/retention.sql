-- The queries of scheduler/retention.py: the artifact sweep; pruning of logs, jobs, events, workers, GPU samples.

-- name: unreferenced_artifacts --
-- Artifacts older than the retention cutoff (never named by a job: than :unnamed_cutoff, the later one)
-- that no queued, running or retained (finished after the cutoff) job names: as source, input,
-- service weights, image blob, output or a file of one of its checkpoints.
WITH live AS (
    SELECT id, spec FROM jobs WHERE state IN ('waiting', 'queued', 'running') OR finished_at >= :cutoff
),
refs(digest) AS (
    SELECT json_extract(spec, '$.source') FROM live
    UNION SELECT json_extract(spec, '$.service.weights') FROM live
    UNION SELECT i.value FROM live, json_each(live.spec, '$.inputs') i
    UNION SELECT json_extract(spec, '$.image.manifest') FROM live
    UNION SELECT b.value FROM live, json_each(live.spec, '$.image.blobs') b
    UNION SELECT o.value FROM tasks t JOIN live ON live.id = t.job_id, json_each(t.outputs) o
    UNION SELECT f.digest FROM checkpoints c JOIN live ON live.id = c.job_id
                          JOIN checkpoint_files f ON f.checkpoint_id = c.id
)
SELECT digest, size FROM artifacts
WHERE (last_used_at < :cutoff OR (named_at IS NULL AND last_used_at < :unnamed_cutoff)) AND digest NOT IN (SELECT digest FROM refs WHERE digest IS NOT NULL)
ORDER BY last_used_at;

-- name: delete_artifact --
-- Forget one artifact (its file is removed after the commit).
DELETE FROM artifacts WHERE digest = :digest RETURNING digest, size;

-- name: delete_artifact_uploads --
-- Forget who uploaded an artifact the sweep forgets.
DELETE FROM artifact_uploads WHERE digest = :digest;

-- name: prune_log_jobs --
-- Retention (read, no lock): ended jobs, ended before the log cutoff, that still have log lines.
SELECT id FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost') AND finished_at < :cutoff
  AND EXISTS (SELECT 1 FROM logs WHERE logs.job_id = jobs.id)
ORDER BY id LIMIT :n;

-- name: prune_job_logs --
-- Retention: up to :n log lines of one job that ended before the cutoff.
DELETE FROM logs WHERE seq IN (
    SELECT seq FROM logs WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY seq LIMIT :n)
RETURNING seq;

-- name: prune_old_jobs --
-- Retention (read, no lock): jobs that ended before the job cutoff, oldest first.
SELECT id FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost') AND finished_at < :cutoff
ORDER BY id LIMIT :n;

-- name: prune_job_events --
-- Retention: up to :n events of one job that ended before the cutoff (its logs are gone by then).
DELETE FROM events WHERE seq IN (
    SELECT seq FROM events WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY seq LIMIT :n)
RETURNING seq;

-- name: prune_job_rendezvous --
-- Retention: the rendezvous rows of one pruned job.
DELETE FROM rendezvous WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job_dependencies --
-- Retention: up to :n of what one pruned job ran after, and of what ran after it (a job waits only
-- on a job that has not ended, so no waiting job loses a dependency here).
DELETE FROM job_dependencies WHERE rowid IN (
    SELECT rowid FROM job_dependencies WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    UNION ALL
    SELECT rowid FROM job_dependencies WHERE after_job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    LIMIT :n)
RETURNING job_id;

-- name: prune_job_tasks --
-- Retention: up to :n tasks of one pruned job, lowest id first (before the job: tasks reference it).
DELETE FROM tasks WHERE id IN (
    SELECT id FROM tasks WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY id LIMIT :n)
RETURNING id;

-- name: prune_job_sessions --
-- Retention: up to :n relay sessions (exec, shell, SSH, port-forward rows) of one pruned job.
DELETE FROM sessions WHERE id IN (
    SELECT id FROM sessions WHERE job_id = :job_id
      AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
    ORDER BY id LIMIT :n)
RETURNING id;

-- name: prune_job --
-- Retention: the job row itself, once it has no log lines, tasks, events, sessions or dependencies left.
DELETE FROM jobs WHERE id = :job_id AND finished_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM logs WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM sessions WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM events WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM job_dependencies WHERE job_id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM job_dependencies WHERE after_job_id = :job_id)
RETURNING id;

-- name: prune_job_webhook_deliveries --
-- Retention: the deliveries of the webhooks and mailboxes of one job pruned (prune_job_webhooks).
DELETE FROM webhook_deliveries WHERE webhook_id IN (
    SELECT id FROM webhooks WHERE scope = 'job' AND job_id = :job_id
      AND NOT EXISTS (SELECT 1 FROM jobs WHERE id = :job_id)
      AND NOT EXISTS (SELECT 1 FROM alerts WHERE webhook_id = webhooks.id));

-- name: prune_job_webhooks --
-- Retention: the webhooks and mailboxes (`submit --mail-user`) of one job pruned, which can fire no more:
-- kept, they would fire for a later job given the same id. Not one an alert delivers to.
DELETE FROM webhooks WHERE scope = 'job' AND job_id = :job_id
  AND NOT EXISTS (SELECT 1 FROM jobs WHERE id = :job_id)
  AND NOT EXISTS (SELECT 1 FROM alerts WHERE webhook_id = webhooks.id)
RETURNING id;

-- name: prune_loose_events --
-- Retention (read, no lock): events of no job (workers, upkeep) older than the cutoff.
SELECT seq FROM events WHERE job_id IS NULL AND at < :cutoff ORDER BY seq LIMIT :n;

-- name: prune_events --
-- Retention: delete the events prune_loose_events found, if they still qualify.
DELETE FROM events
WHERE seq IN (SELECT value FROM json_each(:seqs)) AND job_id IS NULL AND at < :cutoff
RETURNING seq;

-- name: prune_gone_workers --
-- Retention (read, no lock): workers gone before the cutoff that no remaining task names.
SELECT id FROM workers w
WHERE state = 'gone' AND last_seen_at < :cutoff AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.worker_id = w.id)
ORDER BY id LIMIT :n;

-- name: prune_worker --
-- Retention: one departed worker's row, if it still qualifies.
DELETE FROM workers
WHERE id = :worker_id AND state = 'gone' AND last_seen_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM tasks WHERE worker_id = :worker_id)
RETURNING id;

-- name: prune_gpu_samples --
-- Retention: up to :n GPU samples older than the cutoff, oldest first (gpu_samples_at).
DELETE FROM gpu_samples WHERE rowid IN (
    SELECT rowid FROM gpu_samples WHERE at < :cutoff ORDER BY at LIMIT :n)
RETURNING rowid;

-- name: prune_preview --
-- `gpulayer server prune --dry-run`: what each rule would remove now
-- (:lines_cutoff is the later of the log and job cutoffs).
SELECT
  (SELECT count(*) FROM gpu_samples WHERE at < :gpu_cutoff) AS gpu_samples,
  (SELECT count(*) FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                               AND finished_at < :job_cutoff) AS jobs,
  (SELECT count(*) FROM logs WHERE job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :lines_cutoff)) AS log_lines,
  (SELECT count(*) FROM events WHERE (job_id IS NULL AND at < :job_cutoff) OR job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :job_cutoff)) AS events,
  (SELECT count(*) FROM sessions WHERE job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :job_cutoff)) AS sessions,
  (SELECT count(*) FROM workers w WHERE state = 'gone' AND last_seen_at < :job_cutoff
      AND NOT EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.id = t.job_id
                      WHERE t.worker_id = w.id AND NOT (j.finished_at < :job_cutoff))) AS workers;

-- name: prune_job_preemptions --
-- Retention: the preemptions of the :n tasks prune_job_tasks removes next (the usage ledger's rows
-- keep preempted_by). (Read through the job's tasks, before they go: preemptions_task serves it.)
DELETE FROM preemptions WHERE task_id IN (SELECT id FROM tasks WHERE job_id = :job_id ORDER BY id LIMIT :n)
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
RETURNING id;

-- name: prune_job_idle_reclaims --
-- Retention: what the idle check did to the same :n tasks (idle_reclaims_task serves it).
DELETE FROM idle_reclaims WHERE task_id IN (SELECT id FROM tasks WHERE job_id = :job_id ORDER BY id LIMIT :n)
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job_checkpoint_files --
-- Retention: the files of one pruned job's checkpoints (before their rows).
DELETE FROM checkpoint_files WHERE checkpoint_id IN (SELECT id FROM checkpoints WHERE job_id = :job_id)
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job_checkpoints --
-- Retention: one pruned job's checkpoints.
DELETE FROM checkpoints WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);
