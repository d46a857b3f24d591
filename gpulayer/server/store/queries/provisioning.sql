-- The queries of provisioning/loop.py: Slurm provisioning requests.

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
WHERE t.state = 'queued' AND t.held = 0  -- a held task (dependencies, a %N cap) asks for no worker yet
  AND NOT EXISTS (SELECT 1 FROM job_worker_fit f WHERE f.job_id = j.id AND f.fits_now)
  -- the shapes that fit it are the profile alone
  AND (SELECT group_concat(s.n) FROM shapes s
       WHERE j.gpus <= s.gpus AND j.cpus <= s.cpus AND j.memory_mb <= s.memory_mb
         AND (j.accelerator IS NULL OR s.gpus > 0)
         AND NOT EXISTS (SELECT 1 FROM json_each(j.labels) l
                         WHERE NOT EXISTS (SELECT 1 FROM json_each(s.labels) sl
                                           WHERE sl.key = l.key AND sl.value = l.value))
         AND NOT EXISTS (SELECT 1 FROM json_each(j.secrets) js
                         LEFT JOIN secrets sc ON sc.project_id = j.project_id AND sc.name = js.value
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

-- name: closed_provision_requests --
-- Of the request ids :ids (a JSON list: those of Pods still Pending), the ones failed or cancelled, whose Pod the
-- Kubernetes provisioner may delete (an attached one's Pod may only look Pending to a lagging API).
SELECT id FROM provision_requests
WHERE id IN (SELECT value FROM json_each(:ids)) AND state IN ('failed', 'cancelled');

-- name: last_provision_request --
-- The newest request of one profile (its state and when it last changed).
SELECT id, state, updated_at FROM provision_requests
WHERE provisioner = :provisioner AND profile = :profile
ORDER BY id DESC LIMIT 1;

-- name: list_provision_requests --
-- Recent requests, newest first, with the worker that attached: before the id :before (NULL: the newest).
SELECT p.id, p.provisioner, p.profile, p.state, p.slurm_job_id, p.worker_id, w.name AS worker_name,
       w.state AS worker_state, p.last_error, p.created_at, p.updated_at
FROM provision_requests p LEFT JOIN workers w ON w.id = p.worker_id
WHERE :before IS NULL OR p.id < :before
ORDER BY p.id DESC LIMIT :limit;
