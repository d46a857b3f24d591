-- The queries of scheduler/checkpoints.py: recording, restoring, listing and pruning checkpoints.

-- name: checkpoint_task --
-- The task a worker records a checkpoint for, as it holds it (no row: not this worker's task).
SELECT id, job_id, "index", attempt, state FROM tasks WHERE id = :task_id AND worker_id = :worker_id;

-- name: checkpoint_missing_digests --
-- The files of a manifest (:files, a JSON array of {path, digest, size, mode}) whose artifact is not
-- stored with that size: a checkpoint is recorded only when this is empty.
SELECT json_extract(f.value, '$.path') AS path, json_extract(f.value, '$.digest') AS digest
FROM json_each(:files) f
WHERE NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.digest = json_extract(f.value, '$.digest')
                                              AND a.size = json_extract(f.value, '$.size'))
LIMIT 5;

-- name: element_checkpoint_names --
-- Does a checkpoint of this element or rank name the digest (a file restored and not changed since: its
-- worker may name it again, even for a rank whose attempt's end stopped it first)?
SELECT 1 AS ok FROM checkpoint_files f JOIN checkpoints c ON c.id = f.checkpoint_id
WHERE f.digest = :digest AND c.job_id = :job_id AND c."index" = :index
LIMIT 1;

-- name: insert_checkpoint --
-- One checkpoint's row (its files follow: insert_checkpoint_files).
INSERT INTO checkpoints (job_id, "index", task_id, attempt, worker_id, kind, created_at, files, bytes)
SELECT :job_id, :index, :task_id, :attempt, :worker_id, :kind, :now, count(*), coalesce(sum(json_extract(f.value, '$.size')), 0)
FROM json_each(:files) f
RETURNING id, files, bytes;

-- name: insert_checkpoint_files --
-- A checkpoint's manifest, one row per file.
INSERT INTO checkpoint_files (checkpoint_id, path, digest, size, mode)
SELECT :checkpoint_id, json_extract(f.value, '$.path'), json_extract(f.value, '$.digest'),
       json_extract(f.value, '$.size'), json_extract(f.value, '$.mode')
FROM json_each(:files) f;

-- name: touch_checkpoint_artifacts --
-- The artifacts a new checkpoint names were used now (the sweep's age counts from their last use).
UPDATE artifacts SET last_used_at = :now
WHERE digest IN (SELECT json_extract(f.value, '$.digest') FROM json_each(:files) f);

-- name: prune_element_checkpoint_files --
-- The files of an element's checkpoints beyond the newest :keep (before their rows: prune_element_checkpoints).
DELETE FROM checkpoint_files WHERE checkpoint_id IN (
    SELECT id FROM checkpoints WHERE job_id = :job_id AND "index" = :index
    ORDER BY id DESC LIMIT -1 OFFSET :keep);

-- name: prune_element_checkpoints --
-- An element's checkpoints beyond the newest :keep.
DELETE FROM checkpoints WHERE id IN (
    SELECT id FROM checkpoints WHERE job_id = :job_id AND "index" = :index
    ORDER BY id DESC LIMIT -1 OFFSET :keep)
RETURNING id;

-- name: latest_checkpoint --
-- The newest checkpoint of an element (what its next attempt restores), or no row.
SELECT id, attempt, task_id, created_at, files, bytes FROM checkpoints
WHERE job_id = :job_id AND "index" = :index
ORDER BY id DESC LIMIT 1;

-- name: checkpoint_manifest --
-- One checkpoint's files, by path.
SELECT path, digest, size, mode FROM checkpoint_files WHERE checkpoint_id = :checkpoint_id ORDER BY path;

-- name: list_checkpoints --
-- A job's checkpoints (one element's with :index), oldest first, after the cursor :after (an id).
SELECT id, "index", task_id, attempt, worker_id, kind, created_at, files, bytes FROM checkpoints
WHERE job_id = :job_id AND (:index IS NULL OR "index" = :index) AND id > :after
ORDER BY id LIMIT :n;

-- name: job_checkpoint --
-- One checkpoint of a job: by id, else the newest of an attempt (:attempt), else the newest; one element's with :index.
SELECT id, "index", task_id, attempt, worker_id, kind, created_at, files, bytes FROM checkpoints
WHERE job_id = :job_id AND (:index IS NULL OR "index" = :index)
  AND (:checkpoint_id IS NULL OR id = :checkpoint_id) AND (:attempt IS NULL OR attempt = :attempt)
ORDER BY id DESC LIMIT 1;

-- name: checkpoint_of_later_attempt --
-- Has the element a checkpoint of an attempt after :attempt? (A stopped rank's late finish is then too old.)
SELECT 1 AS ok FROM checkpoints WHERE job_id = :job_id AND "index" = :index AND attempt > :attempt LIMIT 1;
