-- The queries of scheduler/access.py: who may read, probe and upload artifacts; the artifact row.

-- name: artifact_allowed_for_worker --
-- A worker may read the artifacts its active tasks name (source, inputs, weights, an image's manifest and blobs).
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND (json_extract(j.spec, '$.source') = :digest
       OR json_extract(j.spec, '$.service.weights') = :digest
       OR json_extract(j.spec, '$.image.manifest') = :digest
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest)
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.image.blobs') b WHERE b.value = :digest))
LIMIT 1;

-- name: artifact_allowed_for_user --
-- A non-admin client downloads only what a job it may read names (source, inputs, weights,
-- an image's manifest and blobs, an output): its own jobs, its managed projects' and, in projects of visibility `project`,
-- its projects' jobs: the `read` level of teams._level, written again here.
WITH readable(id) AS (
    SELECT id FROM jobs WHERE user_id = :user_id
    UNION
    SELECT j.id FROM memberships m JOIN projects p ON p.id = m.project_id JOIN jobs j ON j.project_id = m.project_id
    WHERE m.user_id = :user_id AND (m.role = 'manager' OR p.visibility = 'project')
)
SELECT 1 AS ok FROM readable r JOIN jobs j ON j.id = r.id
WHERE json_extract(j.spec, '$.source') = :digest
   OR json_extract(j.spec, '$.service.weights') = :digest
   OR json_extract(j.spec, '$.image.manifest') = :digest
   OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest)
   OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.image.blobs') b WHERE b.value = :digest)
   OR EXISTS (SELECT 1 FROM tasks t, json_each(t.outputs) o WHERE t.job_id = j.id AND o.value = :digest)
LIMIT 1;

-- name: worker_holds_task --
-- Does the worker hold any active task (it may upload outputs)?
SELECT 1 AS ok FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running') LIMIT 1;

-- name: record_artifact --
-- An artifact arrived (or was used again).
INSERT INTO artifacts (digest, size, created_at, last_used_at) VALUES (:digest, :size, :now, :now)
ON CONFLICT (digest) DO UPDATE SET last_used_at = excluded.last_used_at;

-- name: worker_may_upload --
-- A worker uploads only outputs: it must hold an active task whose job declares some.
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND json_array_length(j.spec, '$.outputs') > 0
LIMIT 1;

-- name: artifact_recorded --
-- Is this artifact's row there? The sweep asks again, under the digest's lock, before it unlinks.
SELECT 1 AS ok FROM artifacts WHERE digest = :digest;
