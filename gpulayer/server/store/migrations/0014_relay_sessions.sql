-- Version 14: the relay (issue 26). `workers.relay`: what the agent said of the relay when it registered
-- ({"version", "kinds"}; '{}' for an older agent); `sessions`: one row per stream through the relay.
ALTER TABLE workers ADD COLUMN relay TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(relay));

CREATE TABLE sessions (
    id         INTEGER PRIMARY KEY,
    worker_id  INTEGER NOT NULL,
    job_id     INTEGER NOT NULL,
    task_id    INTEGER NOT NULL,
    user       TEXT NOT NULL,                     -- the caller's actor: user:alice
    kind       TEXT NOT NULL,                     -- exec (later shell, ssh, port-forward)
    detail     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail)),  -- the kind's fields: exec's argv
    opened_at  REAL NOT NULL,
    closed_at  REAL,
    bytes_in   INTEGER NOT NULL DEFAULT 0 CHECK (bytes_in >= 0),   -- from the client towards the task
    bytes_out  INTEGER NOT NULL DEFAULT 0 CHECK (bytes_out >= 0),  -- from the task towards the client
    exit_code  INTEGER,
    end_reason TEXT,
    CHECK ((closed_at IS NULL) = (end_reason IS NULL))
) STRICT;
CREATE INDEX sessions_job ON sessions (job_id, id);
CREATE INDEX sessions_open ON sessions (worker_id) WHERE closed_at IS NULL;
