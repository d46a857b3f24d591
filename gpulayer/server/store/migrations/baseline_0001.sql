-- Frozen: schema.sql as it stood at version 1, the start that migrations replay from. Never edit.

-- GPUlayer state file: the one source of truth for its schema.
--
-- Every table is STRICT; every state column is CHECKed; times are Unix
-- seconds (REAL); JSON columns are CHECKed with json_valid. The file stays
-- readable by the stock sqlite3 3.40 CLI: no function or syntax newer than
-- 3.40 appears in a view. `PRAGMA user_version` below is the schema version;
-- gpulayer/server/store/migrations/NNNN_*.sql bring an older file up to it.

PRAGMA user_version = 1;

-- Join and client tokens. `server init` writes the hashes of its two tokens to
-- server-credentials.json; tokens minted later (`gpulayer token create`) live
-- here. Only a keyed BLAKE2b hash of the secret is stored, never the secret.
CREATE TABLE tokens (
    jti          TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN (
                     'join',      -- glj_: may only register a worker
                     'client',    -- glc_: the /v1 client API
                     'metrics'    -- glm_: only GET /metrics
                 )),
    name         TEXT NOT NULL,
    labels       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    token_hash   TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    expires_at   REAL,
    revoked_at   REAL,
    source       TEXT NOT NULL DEFAULT 'minted' CHECK (source IN ('minted', 'provisioner'))
) STRICT;

-- One row per worker registration. A worker keeps its row (and session
-- token) across leases it loses; it gets a new row when it registers again.
CREATE TABLE workers (
    id                 INTEGER PRIMARY KEY,
    name               TEXT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'online' CHECK (state IN (
                           'online',         -- heartbeating; may receive tasks
                           'offline',        -- lease expired; its next heartbeat brings it back
                           'needs_upgrade',  -- refused for speaking another protocol
                           'gone'            -- deregistered or revoked; never comes back
                       )),
    labels             TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    token_labels       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(token_labels)),  -- labels its join token carries (secrets need them)
    cpus               REAL NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    gpus               INTEGER NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    memory_mb          INTEGER NOT NULL DEFAULT 0 CHECK (memory_mb >= 0),
    gpu_models         TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_models)),
    slots              INTEGER NOT NULL DEFAULT 1 CHECK (slots >= 1),
    advertise_address  TEXT,
    version            TEXT,
    protocol           INTEGER,
    session_hash       TEXT UNIQUE,
    token_jti          TEXT,            -- the join token it registered with ('server' for server init's)
    registered_at      REAL NOT NULL,
    last_seen_at       REAL NOT NULL,
    lease_expires_at   REAL,
    gone_reason        TEXT,
    CHECK (state <> 'gone' OR gone_reason IS NOT NULL)
) STRICT;
CREATE INDEX workers_online_lease ON workers (lease_expires_at) WHERE state = 'online';

-- What users submitted. `spec` is the JobSpec as stored (normalised);
-- the requirement columns are copies of it that placement reads.
CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    name              TEXT,
    state             TEXT NOT NULL DEFAULT 'queued' CHECK (state IN (
                          'queued',     -- waiting for placement (or re-placement)
                          'running',    -- at least one task assigned or running
                          'succeeded',  -- every task exited 0
                          'failed',     -- a task failed or timed out and is not retried
                          'cancelled',  -- cancelled by a user
                          'lost'        -- a task was lost and is not retried
                      )),
    spec              TEXT NOT NULL CHECK (json_valid(spec)),
    kind              TEXT NOT NULL DEFAULT 'batch' CHECK (kind IN ('batch', 'service')),
    priority          INTEGER NOT NULL DEFAULT 0,
    labels            TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    secrets           TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(secrets)),  -- names; values live in `secrets`
    accelerator       TEXT CHECK (accelerator IS NULL OR accelerator IN ('cuda')),
    gpus              INTEGER NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    cpus              REAL NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    memory_mb         INTEGER NOT NULL DEFAULT 0 CHECK (memory_mb >= 0),
    width             INTEGER NOT NULL DEFAULT 1 CHECK (width >= 1),    -- replicas or nodes
    gang              INTEGER NOT NULL DEFAULT 0 CHECK (gang IN (0, 1)), -- multi-node: placed all at once
    attempt           INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts      INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    retry_on          TEXT NOT NULL DEFAULT '["worker_lost"]' CHECK (json_valid(retry_on)),
    exit_code         INTEGER,
    reason            TEXT,
    created_at        REAL NOT NULL,
    finished_at       REAL,
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'lost')) = (finished_at IS NOT NULL))
) STRICT;
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_name ON jobs (name) WHERE name IS NOT NULL;
-- Gang placement looks only at queued multi-node jobs, best first.
CREATE INDEX jobs_queued_gangs ON jobs (priority DESC, id) WHERE state = 'queued' AND gang = 1;

-- One row per replica / rank per attempt. A retry adds rows with attempt + 1;
-- the old rows stay as history. Leases are timestamps on the rows.
CREATE TABLE tasks (
    id                INTEGER PRIMARY KEY,
    job_id            INTEGER NOT NULL REFERENCES jobs (id),
    "index"           INTEGER NOT NULL DEFAULT 0 CHECK ("index" >= 0),  -- replica or rank
    attempt           INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    state             TEXT NOT NULL DEFAULT 'queued' CHECK (state IN (
                          'queued',     -- waiting for a worker
                          'assigned',   -- given to a worker, not started yet
                          'running',    -- its process runs on the worker
                          'succeeded',  -- exited 0
                          'failed',     -- exited non-zero, timed out, or was stopped with its job
                          'cancelled',  -- cancelled by a user
                          'lost'        -- its lease expired, its worker left, or it was not started in time
                      )),
    priority          INTEGER NOT NULL DEFAULT 0,
    worker_id         INTEGER REFERENCES workers (id),
    gpu_indices       TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_indices)),
    lease_expires_at  REAL,
    cancel_requested  INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    pid               INTEGER,
    endpoint          TEXT,
    address           TEXT,             -- the worker's advertise address when assigned
    restarts          INTEGER NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    exit_code         INTEGER,
    outcome           TEXT CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'cancelled', 'timed_out')),
    reason            TEXT,
    outputs           TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(outputs)),
    created_at        REAL NOT NULL,
    assigned_at       REAL,
    started_at        REAL,
    finished_at       REAL,
    CHECK ((state IN ('assigned', 'running')) = (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL)
           OR state NOT IN ('queued', 'assigned', 'running')),
    CHECK (state <> 'queued' OR worker_id IS NULL),
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'lost')) = (finished_at IS NOT NULL))
) STRICT;
-- Acquisition scans only queued tasks, best first: without this partial index
-- it reads every task ever run.
CREATE INDEX tasks_queued ON tasks (priority DESC, id) WHERE state = 'queued';
-- What a worker holds now: its free resources, its heartbeat, idempotent acquire.
CREATE INDEX tasks_worker_active ON tasks (worker_id, state) WHERE state IN ('assigned', 'running');
-- Lease expiry scans only live leases.
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE state IN ('assigned', 'running');
CREATE INDEX tasks_job ON tasks (job_id, attempt, "index");
-- Ops ask which tasks were lost lately (explorer: lost_tasks).
CREATE INDEX tasks_lost ON tasks (finished_at) WHERE state = 'lost';

-- Append-only log of every state change, written in the same transaction as
-- the change, so the two never disagree.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY,
    at         REAL NOT NULL,
    kind       TEXT NOT NULL,
    job_id     INTEGER,
    task_id    INTEGER,
    worker_id  INTEGER,
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
) STRICT;
CREATE INDEX events_job ON events (job_id, seq) WHERE job_id IS NOT NULL;
CREATE INDEX events_kind_at ON events (kind, at);

-- Task output, one row per line. (task_id, n) is the agent's line number, so
-- a batch sent twice is stored once.
CREATE TABLE logs (
    seq      INTEGER PRIMARY KEY,
    job_id   INTEGER NOT NULL,
    task_id  INTEGER NOT NULL,
    n        INTEGER NOT NULL,
    stream   TEXT NOT NULL CHECK (stream IN ('stdout', 'stderr', 'system')),
    at       REAL NOT NULL,
    text     TEXT NOT NULL,
    UNIQUE (task_id, n)
) STRICT;
CREATE INDEX logs_job ON logs (job_id, seq);

-- Content-addressed blobs under $GPULAYER_HOME/artifacts; the bytes live in
-- files, this table says what is there.
CREATE TABLE artifacts (
    digest       TEXT PRIMARY KEY CHECK (digest GLOB 'sha256:*'),
    size         INTEGER NOT NULL CHECK (size >= 0),
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL
) STRICT;

-- Multi-node rendezvous: one row per rank that arrived.
CREATE TABLE rendezvous (
    job_id      INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    rank        INTEGER NOT NULL CHECK (rank >= 0),
    task_id     INTEGER NOT NULL,
    address     TEXT NOT NULL,
    port        INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    arrived_at  REAL NOT NULL,
    PRIMARY KEY (job_id, attempt, rank)
) STRICT;

-- Secrets passed to jobs as environment variables, encrypted at rest (the
-- key is in a 0600 file beside the server secret, never in this file).
CREATE TABLE secrets (
    name        TEXT PRIMARY KEY,
    labels      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    ciphertext  BLOB NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
) STRICT;

-- Slurm jobs submitted to start workers (docs/operations.md, "Slurm provisioning").
CREATE TABLE provision_requests (
    id              INTEGER PRIMARY KEY,
    provisioner     TEXT NOT NULL,
    profile         TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN (
                        'requested',  -- decided, sbatch not answered yet
                        'pending',    -- sbatch accepted; waiting for the worker to attach
                        'attached',   -- its worker registered
                        'cancelled',  -- scancel'd (timeout, shutdown) or ended
                        'failed'      -- sbatch or the job failed
                    )),
    slurm_job_id    TEXT,
    token_jti       TEXT,             -- the join token minted for this request alone
    worker_id       INTEGER,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    CHECK (state <> 'attached' OR worker_id IS NOT NULL),
    CHECK (state NOT IN ('cancelled', 'failed') OR last_error IS NOT NULL)
) STRICT;
-- At most one open request per profile, and the provisioner finds the open ones fast.
CREATE UNIQUE INDEX provision_requests_open ON provision_requests (provisioner, profile)
    WHERE state IN ('requested', 'pending');

-- Views for the questions ops ask.

-- Which replicas serve where.
CREATE VIEW endpoints AS
SELECT t.job_id, j.name AS job_name, t.id AS task_id, t."index" AS replica,
       t.attempt, t.worker_id, w.name AS worker_name, t.endpoint, t.restarts, t.state
FROM tasks t
JOIN jobs j ON j.id = t.job_id
LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.state IN ('assigned', 'running') AND j.kind = 'service';

-- One line per job: its task counts by state and its time so far.
CREATE VIEW job_summary AS
SELECT j.id AS job_id, j.name, j.state, j.kind, j.priority, j.attempt, j.gpus, j.width,
       j.created_at, j.finished_at,
       (SELECT min(started_at) FROM tasks t WHERE t.job_id = j.id) AS first_started_at,
       (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.state = 'queued') AS queued_tasks,
       (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.state IN ('assigned', 'running')) AS active_tasks,
       (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.state = 'lost') AS lost_tasks,
       j.exit_code, j.reason
FROM jobs j;

-- What each worker has and what is free on it now.
CREATE VIEW worker_load AS
SELECT w.id AS worker_id, w.name, w.state, w.labels, w.slots, w.gpus, w.cpus, w.memory_mb,
       count(t.id) AS active_tasks,
       w.slots - count(t.id) AS free_slots,
       w.gpus - coalesce(sum(j.gpus), 0) AS free_gpus,
       w.cpus - coalesce(sum(j.cpus), 0) AS free_cpus,
       w.memory_mb - coalesce(sum(j.memory_mb), 0) AS free_memory_mb,
       w.last_seen_at, w.lease_expires_at
FROM workers w
LEFT JOIN tasks t ON t.worker_id = w.id AND t.state IN ('assigned', 'running')
LEFT JOIN jobs j ON j.id = t.job_id
GROUP BY w.id;
