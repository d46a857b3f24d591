-- Version 22 (issue 36): who uploaded an artifact (a digest is no read capability of its own), and
-- when a job first named it (the upload quotas and the shorter life of unnamed uploads). Artifacts
-- stored before count as named: they keep the sweep's longer retention and count against no quota.
ALTER TABLE artifacts ADD COLUMN named_at REAL;
UPDATE artifacts SET named_at = created_at;
CREATE TABLE artifact_uploads (
    digest       TEXT NOT NULL CHECK (digest GLOB 'sha256:*'),
    uploader     TEXT NOT NULL CHECK (uploader IN (
                     'user',    -- a client's upload: uploader_id is users.id
                     'worker'   -- an output or checkpoint file: uploader_id is workers.id
                 )),
    uploader_id  INTEGER NOT NULL,
    project_id   INTEGER,       -- the project a user's upload counts against (its only one); NULL: none
    uploaded_at  REAL NOT NULL,
    PRIMARY KEY (uploader, uploader_id, digest)
) STRICT;
CREATE INDEX artifact_uploads_project ON artifact_uploads (project_id) WHERE project_id IS NOT NULL;
CREATE INDEX artifact_uploads_digest ON artifact_uploads (digest);
