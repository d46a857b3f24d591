-- Every query of the control plane, by name. Parameters are named (:now is
-- always a parameter, never the wall clock, so tests pin time).
-- Active task states are 'assigned' and 'running' throughout.
-- A parameter that joins a view (`f.worker_id = CAST(:worker_id AS INTEGER)`) is
-- CAST: SQLite 3.54 prepares a join whose key is a bare parameter again on every
-- run (one job's fit on one worker: ~170 us instead of ~13 us); an expression is not.

-- name: insert_event --
-- Append one event; written in the transaction of the change it records.
INSERT INTO events (at, kind, job_id, task_id, worker_id, data)
VALUES (:now, :kind, :job_id, :task_id, :worker_id, :data);

-- name: insert_job --
-- A submitted job with its placement requirements copied out of the spec.
INSERT INTO jobs (name, state, spec, kind, priority, labels, secrets, accelerator, gpus, cpus, memory_mb,
                  width, gang, attempt, max_attempts, retry_on, created_at)
VALUES (:name, 'queued', :spec, :kind, :priority, :labels, :secrets, :accelerator, :gpus, :cpus, :memory_mb,
        :width, :gang, 1, :max_attempts, :retry_on, :now)
RETURNING id;

-- name: insert_task --
-- One queued task of a job's attempt (a replica or a rank).
INSERT INTO tasks (job_id, "index", attempt, state, priority, created_at)
VALUES (:job_id, :index, :attempt, 'queued', :priority, :now)
RETURNING id;

-- name: assigned_task_for_worker --
-- acquire is idempotent until start: the assigned tasks not started yet (oldest first, at
-- most :limit) are handed out again.
-- (The redundant IN term lets SQLite use the partial index tasks_worker_active;
-- without it this scans every task the worker ever ran: 7 ms at 100k tasks.)
SELECT id FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND state = 'assigned'
  AND cancel_requested = 0
ORDER BY id LIMIT :limit;

-- name: worker_free --
-- What an online worker has free now (worker_load), with what acquisition hands on.
SELECT l.worker_id AS id, l.gpus, l.free_slots, w.advertise_address
FROM worker_load l JOIN workers w ON w.id = l.worker_id
WHERE l.worker_id = CAST(:worker_id AS INTEGER) AND l.state = 'online';

-- name: acquire_task --
-- Atomic acquisition: the best queued task (priority, then first come) of a job that
-- the worker fits now (job_worker_fit.fits_now: labels, accelerator, size, secrets,
-- free room, no other replica of the job on it). Read by shape, not by task: the fit of
-- each shape with queued tasks (shape_worker_fit.fits_now), then each fitting shape's
-- best task of a job the worker holds none of (job_worker_fit.holds_task), then the best
-- of those; so queued tasks the worker cannot take cost nothing. Gang (multi-node) jobs
-- are placed by gang_workers / assign_task instead.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = :address
WHERE id = (
    SELECT head.task_id
    FROM shapes s INDEXED BY shapes_queued
    JOIN shape_worker_fit f ON f.shape_id = s.id AND f.worker_id = CAST(:worker_id AS INTEGER)
    JOIN task_queue head ON head.task_id = (
        SELECT h.task_id FROM task_queue h
        WHERE h.shape_id = s.id
          AND NOT EXISTS (SELECT 1 FROM tasks o
                          WHERE o.worker_id = CAST(:worker_id AS INTEGER) AND o.job_id = h.job_id
                            AND o.state IN ('assigned', 'running'))
        ORDER BY h.priority DESC, h.task_id
        LIMIT 1)
    WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now
    ORDER BY head.priority DESC, head.task_id
    LIMIT 1
)
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus;

-- name: gpus_in_use --
-- Device indices held by the worker's active tasks.
SELECT g.value AS i FROM tasks u, json_each(u.gpu_indices) g
WHERE u.worker_id = :worker_id AND u.state IN ('assigned', 'running');

-- name: set_gpu_indices --
-- Reserve device indices for an assigned task.
UPDATE tasks SET gpu_indices = :gpu_indices WHERE id = :task_id AND state = 'assigned' RETURNING id;

-- name: any_queued_gang --
-- Is any multi-node job waiting? (Gang placement is skipped when none is.)
SELECT 1 AS found FROM jobs INDEXED BY jobs_queued_gangs WHERE state = 'queued' AND gang = 1 LIMIT 1;

-- name: next_gang_job --
-- The best queued multi-node jobs that the polling worker fits now (one rank of)
-- (several, so that a gang too wide for the fleet does not block the ones behind it).
SELECT j.id, j.attempt, j.width
FROM jobs j INDEXED BY jobs_queued_gangs
JOIN job_worker_fit f ON f.job_id = j.id AND f.worker_id = CAST(:worker_id AS INTEGER)
WHERE j.state = 'queued' AND j.gang = 1 AND f.fits_now
ORDER BY j.priority DESC, j.id
LIMIT :limit;

-- name: gang_workers --
-- Distinct workers that fit one rank of :job_id now, the polling worker first, then
-- those left with the fewest free GPUs.
SELECT f.worker_id
FROM job_worker_fit f
WHERE f.job_id = CAST(:job_id AS INTEGER) AND f.fits_now
ORDER BY f.worker_id = :worker_id DESC, f.spare_gpus, f.worker_id
LIMIT :width;

-- name: assign_task --
-- Give one queued task (a gang rank) to a given worker.
UPDATE tasks
SET state = 'assigned', worker_id = :worker_id, assigned_at = :now, lease_expires_at = :lease_expires_at,
    address = (SELECT advertise_address FROM workers WHERE id = :worker_id)
WHERE id = :task_id AND state = 'queued'
RETURNING id, job_id, "index", attempt, (SELECT gpus FROM jobs WHERE jobs.id = tasks.job_id) AS gpus;

-- name: queued_tasks_of_attempt --
-- The ranks of one gang attempt still waiting, in rank order.
SELECT id, "index" FROM tasks
WHERE job_id = :job_id AND attempt = :attempt AND state = 'queued'
ORDER BY "index";

-- name: mark_job_running --
-- A job leaves the queue when its first task is assigned.
UPDATE jobs SET state = 'running' WHERE id = :job_id AND state = 'queued';

-- name: assignment --
-- Everything a worker needs to run a task.
SELECT t.id AS task_id, t.job_id, t.attempt, t."index", t.gpu_indices, j.spec, j.width, j.gang
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.id = :task_id;

-- name: start_task --
-- The worker started the task's process: ownership-checked.
UPDATE tasks SET state = 'running', started_at = :now, pid = :pid
WHERE id = :task_id AND worker_id = :worker_id AND state = 'assigned' AND cancel_requested = 0
RETURNING job_id, attempt;

-- name: task_owned --
-- The task as this worker holds it (no row: not this worker's task).
SELECT id, job_id, attempt, "index", state, cancel_requested, pid
FROM tasks WHERE id = :task_id AND worker_id = :worker_id;

-- name: insert_log --
-- One log line; (task_id, n) makes a retried batch harmless. A line sent without
-- `n` (NULL) goes after the task's last line (the UNIQUE index finds the max).
INSERT OR IGNORE INTO logs (job_id, task_id, n, stream, at, text)
VALUES (:job_id, :task_id,
        COALESCE(:n, (SELECT COALESCE(MAX(n) + 1, 0) FROM logs WHERE task_id = :task_id)),
        :stream, :at, :text);

-- name: finish_task --
-- Record a task's result, only while this worker holds it.
UPDATE tasks
SET state = :state, exit_code = :exit_code, outcome = :outcome, reason = :reason,
    outputs = :outputs, finished_at = :now, endpoint = NULL
WHERE id = :task_id AND worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt, "index", worker_id, cancel_requested;

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
-- What the control plane thinks this worker holds, and what it wants cancelled.
SELECT id, cancel_requested FROM tasks
WHERE worker_id = :worker_id AND state IN ('assigned', 'running');

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
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
    started_at = NULL, pid = NULL, address = NULL, endpoint = NULL
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('assigned', 'running')
RETURNING id, worker_id;

-- name: clear_rendezvous --
-- Forget the arrivals of a released gang attempt.
DELETE FROM rendezvous WHERE job_id = :job_id AND attempt = :attempt;

-- name: job_for_update --
-- The job row that task-ending decisions read.
SELECT id, state, kind, width, gang, attempt, max_attempts, retry_on, priority
FROM jobs WHERE id = :job_id;

-- name: attempt_tasks --
-- Every task of one attempt of a job.
SELECT id, "index", state, exit_code, outcome, reason, worker_id, cancel_requested
FROM tasks WHERE job_id = :job_id AND attempt = :attempt ORDER BY "index";

-- name: stop_attempt_tasks --
-- Stop the other tasks of an attempt: queued ones end now, active ones are
-- cancelled through their worker's heartbeat.
UPDATE tasks
SET state = CASE WHEN state IN ('queued', 'assigned') THEN :state ELSE state END,
    finished_at = CASE WHEN state IN ('queued', 'assigned') THEN :now ELSE finished_at END,
    reason = coalesce(reason, :reason),
    cancel_requested = CASE WHEN state = 'running' THEN 1 ELSE cancel_requested END
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('queued', 'assigned', 'running')
RETURNING id, state;

-- name: detach_running_tasks --
-- Tasks of an attempt that is being replaced: they end for the control plane now
-- (their workers are told to kill them) so that the new attempt can be placed.
UPDATE tasks
SET state = :state, finished_at = :now, reason = coalesce(reason, :reason), cancel_requested = 1, endpoint = NULL
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('queued', 'assigned', 'running')
RETURNING id, worker_id;

-- name: next_attempt --
-- Count one more attempt of a job and queue it again.
UPDATE jobs SET attempt = attempt + 1, state = 'queued'
WHERE id = :job_id AND state IN ('queued', 'running')
RETURNING attempt, width, priority;

-- name: finish_job --
-- A job ends for good, once.
UPDATE jobs SET state = :state, exit_code = :exit_code, reason = :reason, finished_at = :now
WHERE id = :job_id AND state IN ('queued', 'running')
RETURNING id;

-- name: cancel_queued_tasks --
-- Cancel: tasks not yet running end at once.
UPDATE tasks SET state = 'cancelled', reason = 'cancelled', finished_at = :now
WHERE job_id = :job_id AND state IN ('queued', 'assigned')
RETURNING id;

-- name: cancel_running_tasks --
-- Cancel: running tasks are stopped through their worker's next heartbeat.
UPDATE tasks SET cancel_requested = 1
WHERE job_id = :job_id AND state = 'running'
RETURNING id, worker_id;

-- name: register_worker --
-- A new worker row with its hashed session token.
INSERT INTO workers (name, state, labels, token_labels, cpus, gpus, memory_mb, gpu_models, slots,
                     advertise_address, version, protocol, session_hash, token_jti,
                     registered_at, last_seen_at, lease_expires_at)
VALUES (:name, 'online', :labels, :token_labels, :cpus, :gpus, :memory_mb, :gpu_models, :slots,
        :advertise_address, :version, :protocol, :session_hash, :token_jti,
        :now, :now, :lease_expires_at)
RETURNING id;

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

-- name: worker_tasks_lost --
-- What a departing worker held ends as lost, for the retry policy to judge.
UPDATE tasks SET state = 'lost', reason = :reason, finished_at = :now, endpoint = NULL
WHERE worker_id = :worker_id AND state IN ('assigned', 'running')
RETURNING id, job_id, attempt;

-- name: workers_of_token --
-- The live workers that registered with a join token.
SELECT id FROM workers WHERE token_jti = :jti AND state IN ('online', 'offline');

-- name: worker_by_session --
-- Authenticate a worker session token by its hash.
SELECT id, name, state, gone_reason, session_hash, labels, token_labels, advertise_address, token_jti
FROM workers WHERE session_hash = :session_hash;

-- name: rendezvous_arrive --
-- A rank reports where it listens; arriving again overwrites.
INSERT INTO rendezvous (job_id, attempt, rank, task_id, address, port, arrived_at)
VALUES (:job_id, :attempt, :rank, :task_id, :address, :port, :now)
ON CONFLICT (job_id, attempt, rank) DO UPDATE
SET task_id = excluded.task_id, address = excluded.address, port = excluded.port, arrived_at = excluded.arrived_at;

-- name: rendezvous_peers --
-- The ranks of an attempt that arrived, in rank order.
SELECT rank, address, port FROM rendezvous
WHERE job_id = :job_id AND attempt = :attempt ORDER BY rank;

-- name: get_job --
-- One job.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at
FROM jobs WHERE id = :job_id;

-- name: job_tasks --
-- The tasks of a job, every attempt, newest attempt first.
SELECT t.id AS task_id, t."index", t.attempt, t.state, t.worker_id, t.endpoint, t.exit_code,
       t.restarts, t.started_at, t.finished_at, t.reason, t.address, t.outcome, t.outputs,
       w.name AS worker_name
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.job_id = :job_id ORDER BY t.attempt DESC, t."index";

-- name: list_jobs --
-- Jobs newest first, optionally of one state, before a job id.
SELECT id, name, state, spec, kind, attempt, exit_code, reason, created_at, finished_at
FROM jobs
WHERE (:state IS NULL OR state = :state) AND (:before IS NULL OR id < :before)
ORDER BY id DESC LIMIT :limit;

-- name: job_logs --
-- Log lines of a job after a sequence number.
SELECT seq, task_id, stream, at, text FROM logs
WHERE job_id = :job_id AND seq > :after ORDER BY seq LIMIT :limit;

-- name: job_events --
-- The event timeline of a job.
SELECT seq, at, kind, task_id, worker_id, data FROM events
WHERE job_id = :job_id ORDER BY seq;

-- name: job_endpoints --
-- Replica endpoints of the job's current attempt.
SELECT t."index", t.endpoint, t.state FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.job_id = :job_id AND t.attempt = j.attempt ORDER BY t."index";

-- name: list_workers --
-- Workers with what is free on them.
SELECT wl.*, w.gpu_models, w.advertise_address, w.version, w.registered_at, w.gone_reason
FROM worker_load wl JOIN workers w ON w.id = wl.worker_id
WHERE (:include_gone OR wl.state <> 'gone')
ORDER BY wl.worker_id;

-- name: artifact_allowed_for_worker --
-- A worker may read the artifacts its active tasks name (source, inputs, weights).
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND (json_extract(j.spec, '$.source') = :digest
       OR json_extract(j.spec, '$.service.weights') = :digest
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest))
LIMIT 1;

-- name: worker_holds_task --
-- Does the worker hold any active task (it may upload outputs)?
SELECT 1 AS ok FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running') LIMIT 1;

-- name: record_artifact --
-- An artifact arrived (or was used again).
INSERT INTO artifacts (digest, size, created_at, last_used_at) VALUES (:digest, :size, :now, :now)
ON CONFLICT (digest) DO UPDATE SET last_used_at = excluded.last_used_at;

-- name: insert_token --
-- A minted token (only its hash).
INSERT INTO tokens (jti, kind, name, labels, token_hash, created_at, expires_at, source)
VALUES (:jti, :kind, :name, :labels, :token_hash, :now, :expires_at, :source);

-- name: token_by_hash --
-- Authenticate a minted token by its hash.
SELECT jti, kind, name, labels, token_hash, expires_at, revoked_at FROM tokens WHERE token_hash = :token_hash;

-- name: list_tokens --
-- Minted tokens, never their hashes.
SELECT jti, kind, name, labels, created_at, expires_at, revoked_at, source FROM tokens ORDER BY created_at;

-- name: revoke_token --
-- Revoke a token once.
UPDATE tokens SET revoked_at = :now WHERE jti = :jti AND revoked_at IS NULL RETURNING jti, kind;

-- name: get_token --
-- One token, without its hash.
SELECT jti, kind, name, labels, created_at, expires_at, revoked_at FROM tokens WHERE jti = :jti;

-- name: requeue_job --
-- A released gang waits in the queue again.
UPDATE jobs SET state = 'queued' WHERE id = :job_id AND state = 'running';

-- name: worker_state --
-- A worker's state before a change.
SELECT state, gone_reason FROM workers WHERE id = :worker_id;

-- name: set_task_pid --
-- A started task reports its process id again (a retried start).
UPDATE tasks SET pid = :pid WHERE id = :task_id RETURNING id;

-- name: get_secret --
-- One secret, encrypted.
SELECT name, labels, ciphertext, created_at, updated_at FROM secrets WHERE name = :name;

-- name: put_secret --
-- Set a secret (encrypted by the caller).
INSERT INTO secrets (name, labels, ciphertext, created_at, updated_at)
VALUES (:name, :labels, :ciphertext, :now, :now)
ON CONFLICT (name) DO UPDATE SET labels = excluded.labels, ciphertext = excluded.ciphertext,
                                 updated_at = excluded.updated_at;

-- name: delete_secret --
-- Remove a secret.
DELETE FROM secrets WHERE name = :name RETURNING name;

-- name: list_secrets --
-- Secret names and labels, never values.
SELECT name, labels, created_at, updated_at FROM secrets ORDER BY name;

-- name: metrics_jobs_by_state --
-- gpulayer_jobs{state}.
SELECT state, count(*) AS n FROM jobs GROUP BY state;

-- name: metrics_workers_by_state --
-- gpulayer_workers{state}.
SELECT state, count(*) AS n FROM workers GROUP BY state;

-- name: metrics_queue_by_labels --
-- gpulayer_queue_depth{labels}: queued tasks by the labels their job asks for.
SELECT j.labels, count(*) AS n FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'queued' GROUP BY j.labels;

-- name: metrics_leases_expired --
-- gpulayer_leases_expired_total: tasks lost to an expired lease, ever (not to a revocation or deregistration).
SELECT count(*) AS n FROM events WHERE kind = 'task_lost' AND json_extract(data, '$.lease_expired') = 1;

-- name: metrics_artifact_bytes --
-- gpulayer_artifact_store_bytes.
SELECT coalesce(sum(size), 0) AS bytes, count(*) AS n FROM artifacts;

-- name: unreferenced_artifacts --
-- Artifacts older than the retention cutoff that no queued, running or retained
-- (finished after the cutoff) job names: as source, input, service weights or output.
WITH live AS (
    SELECT id, spec FROM jobs WHERE state IN ('queued', 'running') OR finished_at >= :cutoff
),
refs(digest) AS (
    SELECT json_extract(spec, '$.source') FROM live
    UNION SELECT json_extract(spec, '$.service.weights') FROM live
    UNION SELECT i.value FROM live, json_each(live.spec, '$.inputs') i
    UNION SELECT o.value FROM tasks t JOIN live ON live.id = t.job_id, json_each(t.outputs) o
)
SELECT digest, size FROM artifacts
WHERE last_used_at < :cutoff AND digest NOT IN (SELECT digest FROM refs WHERE digest IS NOT NULL)
ORDER BY last_used_at;

-- name: delete_artifact --
-- Forget one artifact (its file is removed after the commit).
DELETE FROM artifacts WHERE digest = :digest RETURNING digest, size;

-- name: touch_artifact --
-- A job names this artifact: it counts as used now. No row back: it is not stored.
UPDATE artifacts SET last_used_at = :now WHERE digest = :digest RETURNING digest;

-- name: provision_demand --
-- Queued tasks that no online worker can take now (job_worker_fit.fits_now) and that a
-- worker of this profile could run, its join token carrying the profile's labels: the
-- reason to ask Slurm for one. :labels is the profile's labels as a JSON object; :covered
-- a JSON list of profiles ({cpus, gpus, memory_mb, labels}) already asked for, whose tasks
-- do not count. A profile is no row of `workers`, so job_worker_fit cannot judge it: its
-- fit is written here once, for the profile (shape 0) and the covered ones alike.
WITH shapes AS (
    SELECT 0 AS n, :gpus AS gpus, :cpus AS cpus, :memory_mb AS memory_mb, :labels AS labels
    UNION ALL
    SELECT 1 + c.key, json_extract(c.value, '$.gpus'), json_extract(c.value, '$.cpus'),
           json_extract(c.value, '$.memory_mb'), json_extract(c.value, '$.labels')
    FROM json_each(:covered) c
)
SELECT count(*) AS tasks
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.state = 'queued'
  AND NOT EXISTS (SELECT 1 FROM job_worker_fit f WHERE f.job_id = j.id AND f.fits_now)
  -- the shapes that fit it are the profile alone
  AND (SELECT group_concat(s.n) FROM shapes s
       WHERE j.gpus <= s.gpus AND j.cpus <= s.cpus AND j.memory_mb <= s.memory_mb
         AND (j.accelerator IS NULL OR s.gpus > 0)
         AND NOT EXISTS (SELECT 1 FROM json_each(j.labels) l
                         WHERE NOT EXISTS (SELECT 1 FROM json_each(s.labels) sl
                                           WHERE sl.key = l.key AND sl.value = l.value))
         AND NOT EXISTS (SELECT 1 FROM json_each(j.secrets) js
                         LEFT JOIN secrets sc ON sc.name = js.value
                         WHERE sc.name IS NULL
                            OR EXISTS (SELECT 1 FROM json_each(sc.labels) scl
                                       WHERE NOT EXISTS (SELECT 1 FROM json_each(s.labels) sl
                                                         WHERE sl.key = scl.key AND sl.value = scl.value)))) = '0';

-- name: insert_provision_request --
-- A decision to ask Slurm for a worker; the unique open index refuses a second open one per profile.
INSERT INTO provision_requests (provisioner, profile, state, token_jti, created_at, updated_at)
VALUES (:provisioner, :profile, 'requested', :token_jti, :now, :now)
RETURNING id;

-- name: provision_submitted --
-- sbatch accepted the job.
UPDATE provision_requests SET state = 'pending', slurm_job_id = :slurm_job_id, updated_at = :now
WHERE id = :id AND state = 'requested'
RETURNING id;

-- name: provision_attach --
-- Open requests whose token a worker registered with become attached (to its first worker).
UPDATE provision_requests AS p
SET state = 'attached', worker_id = w.first_worker, updated_at = :now, last_error = NULL
FROM (SELECT token_jti AS jti, min(id) AS first_worker FROM workers
      WHERE token_jti IS NOT NULL AND state <> 'needs_upgrade' GROUP BY token_jti) AS w
WHERE w.jti = p.token_jti AND p.state IN ('requested', 'pending')
RETURNING id, provisioner, profile, slurm_job_id, worker_id, token_jti;

-- name: provision_end --
-- An open request ends as cancelled or failed, with the reason.
UPDATE provision_requests SET state = :state, last_error = :error, updated_at = :now
WHERE id = :id AND state IN ('requested', 'pending')
RETURNING id, provisioner, profile, slurm_job_id, token_jti;

-- name: provision_note_error --
-- An open request keeps its state but shows the latest trouble (squeue unreachable, ...).
UPDATE provision_requests SET last_error = :error, updated_at = :now
WHERE id = :id AND state IN ('requested', 'pending');

-- name: open_provision_requests --
-- Requests still waiting for sbatch or for their worker, oldest first.
SELECT id, provisioner, profile, state, slurm_job_id, token_jti, created_at, updated_at
FROM provision_requests WHERE state IN ('requested', 'pending') ORDER BY id;

-- name: last_provision_request --
-- The newest request of one profile (its state and when it last changed).
SELECT id, state, updated_at FROM provision_requests
WHERE provisioner = :provisioner AND profile = :profile
ORDER BY id DESC LIMIT 1;

-- name: list_provision_requests --
-- Recent requests, newest first, with the worker that attached.
SELECT p.id, p.provisioner, p.profile, p.state, p.slurm_job_id, p.worker_id, w.name AS worker_name,
       w.state AS worker_state, p.last_error, p.created_at, p.updated_at
FROM provision_requests p LEFT JOIN workers w ON w.id = p.worker_id
ORDER BY p.id DESC LIMIT :limit;

-- name: job_waiting_reason --
-- Why a queued job is not placed, read from job_worker_fit, the view acquire and gang
-- placement read: `reason`, the first thing no online worker has (labels, accelerator or
-- size, a secret that is set and whose labels its join token carries); else `busy` when
-- fewer online workers fit it now than it needs at once (one, or a gang's width); both
-- NULL when an acquire would place it now.
WITH j AS (SELECT * FROM jobs WHERE id = CAST(:job_id AS INTEGER) AND state = 'queued'),
f AS (SELECT f.* FROM job_worker_fit f JOIN j ON f.job_id = j.id WHERE f.worker_state = 'online'),
sized AS (SELECT * FROM f WHERE has_labels AND has_accelerator AND big_enough)
SELECT CASE
    WHEN NOT EXISTS (SELECT 1 FROM f) THEN 'no online worker'
    WHEN NOT EXISTS (SELECT 1 FROM f WHERE has_labels) THEN 'no online worker has the labels ' || j.labels
    WHEN NOT EXISTS (SELECT 1 FROM sized) THEN
        printf('no online worker with its labels has the accelerator and size it asks for (%d GPUs, %g CPUs, %d MB)',
               j.gpus, j.cpus, j.memory_mb)
    WHEN NOT EXISTS (SELECT 1 FROM sized WHERE missing_secret IS NULL) THEN (
        SELECT CASE WHEN sc.name IS NULL THEN 'secret ' || m.name || ' is not set'
                    ELSE 'no online worker that fits joined with a token carrying the labels ' || sc.labels
                         || ' of secret ' || m.name END
        FROM (SELECT min(missing_secret) AS name FROM sized) m LEFT JOIN secrets sc ON sc.name = m.name)
END AS reason,
CASE WHEN (SELECT count(*) FROM f WHERE fits_now) < CASE WHEN j.gang = 1 THEN j.width ELSE 1 END
     THEN printf('waiting for capacity: the online workers that fit are busy (%s free at once)',
                 CASE WHEN j.gang = 1 THEN j.width || ' workers' ELSE 'one worker' END || ' with '
                 || j.gpus || ' GPUs, ' || j.cpus || ' CPUs, ' || j.memory_mb || ' MB and a free slot needed')
END AS busy
FROM j;

-- name: schema_objects --
-- How many tables, indexes and views a file holds (an empty file gets schema.sql).
SELECT count(*) AS n FROM sqlite_schema;

-- name: count_jobs --
-- Jobs in a state file (a backup reports what it holds).
SELECT count(*) AS n FROM jobs;

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

-- name: requeue_never_started --
-- A worker that deregisters reported every task it launched first: those still only
-- assigned never ran there and go back to the queue, same attempt (not for gangs,
-- which are placed whole).
UPDATE tasks
SET state = 'queued', worker_id = NULL, gpu_indices = '[]', lease_expires_at = NULL, assigned_at = NULL,
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

-- name: storage_probe --
-- /v1/health after a full disk: an event row of 16 kB, so it needs new pages in the
-- file; storage_probe_undo removes it in the same transaction, whose COMMIT still writes pages.
INSERT INTO events (at, kind, data)
VALUES (0, 'storage_probe', json_object('pad', printf('%.*c', 16384, 'x'))) RETURNING seq;

-- name: storage_probe_undo --
-- The other half of storage_probe.
DELETE FROM events WHERE kind = 'storage_probe' AND at = 0 RETURNING seq;

-- name: worker_may_upload --
-- A worker uploads only outputs: it must hold an active task whose job declares some.
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND json_array_length(j.spec, '$.outputs') > 0
LIMIT 1;

-- name: artifact_recorded --
-- Is this artifact's row there? The sweep asks again, under the digest's lock, before it unlinks.
SELECT 1 AS ok FROM artifacts WHERE digest = :digest;

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
-- Retention: the events of one job that ended before the cutoff (its logs are gone by then).
DELETE FROM events WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff)
RETURNING seq;

-- name: prune_job_rendezvous --
-- Retention: the rendezvous rows of one pruned job.
DELETE FROM rendezvous WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job_tasks --
-- Retention: the tasks of one pruned job (before the job: tasks reference it).
DELETE FROM tasks WHERE job_id = :job_id
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND finished_at < :cutoff);

-- name: prune_job --
-- Retention: the job row itself, once it has no log lines left.
DELETE FROM jobs WHERE id = :job_id AND finished_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM logs WHERE job_id = :job_id)
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

-- name: prune_preview --
-- `gpulayer server prune --dry-run`: what each rule would remove now
-- (:lines_cutoff is the later of the log and job cutoffs).
SELECT
  (SELECT count(*) FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                               AND finished_at < :job_cutoff) AS jobs,
  (SELECT count(*) FROM logs WHERE job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :lines_cutoff)) AS log_lines,
  (SELECT count(*) FROM events WHERE (job_id IS NULL AND at < :job_cutoff) OR job_id IN (
      SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled', 'lost')
                            AND finished_at < :job_cutoff)) AS events,
  (SELECT count(*) FROM workers w WHERE state = 'gone' AND last_seen_at < :job_cutoff
      AND NOT EXISTS (SELECT 1 FROM tasks t JOIN jobs j ON j.id = t.job_id
                      WHERE t.worker_id = w.id AND NOT (j.finished_at < :job_cutoff))) AS workers;
