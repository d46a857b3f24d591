-- The queries of scheduler/secrets.py: secrets, encrypted by the caller.

-- name: get_secret --
-- One secret of a project, encrypted.
SELECT name, labels, ciphertext, created_at, updated_at FROM secrets WHERE project_id = :project_id AND name = :name;

-- name: put_secret --
-- Set a secret (encrypted by the caller).
INSERT INTO secrets (project_id, name, labels, ciphertext, created_at, updated_at)
VALUES (:project_id, :name, :labels, :ciphertext, :now, :now)
ON CONFLICT (project_id, name) DO UPDATE SET labels = excluded.labels, ciphertext = excluded.ciphertext,
                                 updated_at = excluded.updated_at;

-- name: delete_secret --
-- Remove a secret.
DELETE FROM secrets WHERE project_id = :project_id AND name = :name RETURNING name;

-- name: list_secrets --
-- A project's secret names and labels, never values: by name, after :after, at most :limit (-1: all).
SELECT name, labels, created_at, updated_at FROM secrets WHERE project_id = :project_id AND name > :after
ORDER BY name LIMIT :limit;

-- name: task_project --
-- The project of a task's job (its secrets are that project's).
SELECT j.project_id FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id = :task_id;

-- Teams, part B (issue 15): quotas, fair share, preemption, the usage ledger.
