-- Version 16: checkpoints that follow a job (issue 27 part 2): `checkpoints` and `checkpoint_files`.
CREATE TABLE checkpoints (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL,
    "index"     INTEGER NOT NULL CHECK ("index" >= 0),   -- the task's: an array element or a gang rank
    task_id     INTEGER NOT NULL,
    attempt     INTEGER NOT NULL CHECK (attempt >= 1),
    worker_id   INTEGER,
    kind        TEXT NOT NULL CHECK (kind IN (
                    'periodic',  -- every --checkpoint-every while the task ran
                    'final'      -- when the attempt ended for any reason but success
                )),
    created_at  REAL NOT NULL,
    files       INTEGER NOT NULL CHECK (files >= 0),
    bytes       INTEGER NOT NULL CHECK (bytes >= 0)
) STRICT;
-- The newest checkpoint of an element (an assignment's restore), its list, its pruning.
CREATE INDEX checkpoints_element ON checkpoints (job_id, "index", id);

-- A checkpoint's manifest: one row per regular file (path relative to the directory, its
-- artifact, size and permission bits).
CREATE TABLE checkpoint_files (
    checkpoint_id  INTEGER NOT NULL,
    path           TEXT NOT NULL,
    digest         TEXT NOT NULL CHECK (digest GLOB 'sha256:*'),
    size           INTEGER NOT NULL CHECK (size >= 0),
    mode           INTEGER NOT NULL CHECK (mode BETWEEN 0 AND 4095),
    PRIMARY KEY (checkpoint_id, path)
) STRICT;
-- Who may read an artifact a checkpoint names (access.sql), and what the sweep keeps.
CREATE INDEX checkpoint_files_digest ON checkpoint_files (digest);
