-- The queries of scheduler/access.py: who may read, probe and upload artifacts; the artifact row.

-- name: artifact_allowed_for_worker --
-- A worker may read the artifacts its active tasks name (source, inputs, weights, an image's manifest and blobs,
-- the files of their element's checkpoints) and those it uploaded itself (an output or a checkpoint file).
SELECT 1 AS ok FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
  AND (json_extract(j.spec, '$.source') = :digest
       OR json_extract(j.spec, '$.service.weights') = :digest
       OR json_extract(j.spec, '$.image.manifest') = :digest
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.inputs') i WHERE i.value = :digest)
       OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.image.blobs') b WHERE b.value = :digest)
       -- a checkpoint of the same element or rank (its restore: checkpoint_files_digest, then the element)
       OR EXISTS (SELECT 1 FROM checkpoint_files f JOIN checkpoints c ON c.id = f.checkpoint_id
                  WHERE f.digest = :digest AND c.job_id = t.job_id AND c."index" = t."index"))
UNION ALL
SELECT 1 FROM artifact_uploads WHERE uploader = 'worker' AND uploader_id = :worker_id AND digest = :digest
LIMIT 1;

-- name: artifact_allowed_for_user --
-- A non-admin client downloads only what a job it may read names (source, inputs, weights,
-- an image's manifest and blobs, an output, a checkpoint's file): its own jobs, its managed projects' and, in projects of visibility `project`,
-- its projects' jobs: the `read` level of teams._level, written again here; and what it uploaded itself.
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
   OR EXISTS (SELECT 1 FROM checkpoint_files f JOIN checkpoints c ON c.id = f.checkpoint_id
              WHERE f.digest = :digest AND c.job_id = j.id)
UNION ALL
SELECT 1 FROM artifact_uploads WHERE uploader = 'user' AND uploader_id = :user_id AND digest = :digest
LIMIT 1;

-- name: worker_holds_task --
-- Does the worker hold any active task (it may upload outputs)?
SELECT 1 AS ok FROM tasks WHERE worker_id = :worker_id AND state IN ('assigned', 'running') LIMIT 1;

-- name: record_artifact --
-- An artifact arrived (or was used again).
INSERT INTO artifacts (digest, size, created_at, last_used_at) VALUES (:digest, :size, :now, :now)
ON CONFLICT (digest) DO UPDATE SET last_used_at = excluded.last_used_at;

-- name: worker_may_upload --
-- A worker uploads only what its tasks leave: outputs and checkpoints (every task has a checkpoint
-- directory, docs/training.md), so it must hold an active task.
SELECT 1 AS ok FROM tasks t
WHERE t.worker_id = :worker_id AND t.state IN ('assigned', 'running')
LIMIT 1;

-- name: artifact_recorded --
-- Is this artifact's row there? The sweep asks again, under the digest's lock, before it unlinks.
SELECT 1 AS ok FROM artifacts WHERE digest = :digest;

-- name: record_upload --
-- Who uploaded an artifact (its bytes hashed to the digest): a user (:project_id, the project its
-- upload counts against, or NULL) or a worker.
INSERT INTO artifact_uploads (digest, uploader, uploader_id, project_id, uploaded_at)
VALUES (:digest, :uploader, :uploader_id, :project_id, :now)
ON CONFLICT (uploader, uploader_id, digest) DO UPDATE SET uploaded_at = excluded.uploaded_at;

-- name: unnamed_upload_bytes --
-- What the upload quotas count: the bytes of the artifacts a user uploaded that no job has named yet,
-- and those uploaded against a project (:project_id; 0 when none applies).
SELECT (SELECT coalesce(sum(a.size), 0) FROM artifact_uploads u JOIN artifacts a ON a.digest = u.digest
        WHERE u.uploader = 'user' AND u.uploader_id = :user_id AND a.named_at IS NULL) AS user_bytes,
       (SELECT coalesce(sum(a.size), 0) FROM artifacts a
        WHERE a.named_at IS NULL AND a.digest IN (SELECT digest FROM artifact_uploads
                                                  WHERE project_id = :project_id)) AS project_bytes;
