-- GPUlayer state file: the one source of truth for its schema.
--
-- Every table is STRICT; every state column is CHECKed; times are Unix
-- seconds (REAL); JSON columns are CHECKed with json_valid. The file stays
-- readable by the stock sqlite3 3.40 CLI: no function or syntax newer than
-- 3.40 appears in a view. `PRAGMA user_version` below is the schema version;
-- gpulayer/server/store/migrations/NNNN_*.sql bring an older file up to it.

-- Sections, in this order: tokens and teams; workers; jobs and tasks; the queue (shapes,
-- task_queue); events and logs; artifacts, rendezvous, secrets, provisioning; views for ops;
-- fit (which workers a shape and a job fit); quotas, fair share, the usage ledger, preemption,
-- reservations and backfill (job_runtime_model, task_expected_end, reservations), start-time estimates
-- (estimates), quotas' use now
-- and as admission reads them; the claim (claimable_groups, claimable_tasks, claimable_batch).

PRAGMA user_version = 36;

-- ---------------------------------------------------------------------------------------
-- Tokens and teams: tokens, users, projects, memberships.
-- ---------------------------------------------------------------------------------------

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
    source       TEXT NOT NULL DEFAULT 'minted' CHECK (source IN ('minted', 'provisioner')),
    user_id      INTEGER
) STRICT;

-- Teams (docs/teams.md). People who hold client tokens (tokens.user_id; NULL for join and
-- metrics tokens). Id 1 is `admin`, the owner of `server init`'s token.
CREATE TABLE users (
    id                INTEGER PRIMARY KEY,
    name              TEXT NOT NULL UNIQUE,
    admin             INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    max_running_jobs  INTEGER CHECK (max_running_jobs IS NULL OR max_running_jobs >= 0),
    created_at        REAL NOT NULL,
    removed_at        REAL
) STRICT;

-- Groups of users that share GPUs (Slurm accounts, Kueue queues). Id 1 is `default`.
-- `max_priority` is the highest priority its members may give a job (`project set --max-priority`;
-- admins are not bound): above it a submit is refused (403), as Slurm lets users only lower theirs
-- (--nice). Written as ADD COLUMN wrote it, after the last column.
-- idle_*: its idle policy (docs/workers.md "Idle GPUs"); NULL: the fleet default's.
CREATE TABLE projects (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    visibility  TEXT NOT NULL DEFAULT 'private' CHECK (visibility IN (
                    'private',  -- members see that each other's jobs exist, not their logs or outputs
                    'project'   -- members read each other's logs and outputs
                )),
    gpu_quota   INTEGER CHECK (gpu_quota IS NULL OR gpu_quota >= 0),  -- nominal; NULL = no quota
    gpu_borrow  INTEGER NOT NULL DEFAULT 0 CHECK (gpu_borrow >= 0),
    weight      REAL CHECK (weight IS NULL OR weight > 0),
    created_at  REAL NOT NULL
    , max_priority INTEGER NOT NULL DEFAULT 0 CHECK (max_priority BETWEEN -1000000 AND 1000000)
    , idle_timeout_s REAL CHECK (idle_timeout_s IS NULL OR idle_timeout_s > 0)
    , idle_below_pct REAL CHECK (idle_below_pct IS NULL OR idle_below_pct BETWEEN 0 AND 100)
    , idle_action TEXT CHECK (idle_action IS NULL OR idle_action IN ('notify', 'requeue', 'cancel'))
) STRICT;

-- Who is in which project, as what (an admin needs no membership).
CREATE TABLE memberships (
    user_id     INTEGER NOT NULL REFERENCES users (id),
    project_id  INTEGER NOT NULL REFERENCES projects (id),
    role        TEXT NOT NULL CHECK (role IN ('manager', 'member')),
    PRIMARY KEY (user_id, project_id)
) STRICT;
CREATE INDEX memberships_project ON memberships (project_id, user_id);

INSERT INTO users (id, name, admin, created_at) VALUES (1, 'admin', 1, (julianday('now') - 2440587.5) * 86400.0);
INSERT INTO projects (id, name, created_at) VALUES (1, 'default', (julianday('now') - 2440587.5) * 86400.0);

-- ---------------------------------------------------------------------------------------
-- Workers: registrations, cordons, per-GPU health.
-- ---------------------------------------------------------------------------------------

-- One row per worker registration. A worker keeps its row (and session
-- token) across leases it loses; it gets a new row when it registers again.
-- `gpu_topology`: its GPUs' wiring as reported at register (schema 34); `gpu_nvlink`: from it, each GPU's
-- NVLink set by device index (the lowest index of the GPUs joined to it by NVLink, directly or through
-- others; null for a GPU without NVLink), which a `gpu_link` nvlink job's fit counts (schema 35).
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
    isolation          TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(isolation)),
    relay              TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(relay))
    , gpu_sharing TEXT NOT NULL DEFAULT 'off' CHECK (gpu_sharing IN ('off', 'mps', 'time-slice'))
    , gpu_memory_mb INTEGER NOT NULL DEFAULT 0 CHECK (gpu_memory_mb >= 0)
    , gpu_topology TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_topology))
    , gpu_nvlink TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_nvlink)),
    CHECK (state <> 'gone' OR gone_reason IS NOT NULL)
) STRICT;
CREATE INDEX workers_online_lease ON workers (lease_expires_at) WHERE state = 'online';

-- Workers an operator took out of service (`gpulayer worker cordon|drain`, like Slurm's
-- `scontrol update state=drain`): a row while cordoned, deleted by uncordon. Placement gives
-- them no new task (shape_worker_fit.schedulable); what runs there goes on. A draining worker
-- is drained once it holds no task, or at its deadline, when what still runs is stopped and
-- requeued as in a graceful stop (docs/operations.md). A drained worker stays registered.
CREATE TABLE worker_cordons (
    worker_id   INTEGER PRIMARY KEY REFERENCES workers (id) ON DELETE CASCADE,
    state       TEXT NOT NULL CHECK (state IN (
                    'cordoned',  -- no new tasks; running ones go on
                    'draining',  -- cordoned, and drained when its tasks have ended or at its deadline
                    'drained'    -- holds no task; still registered and heartbeating
                )),
    reason      TEXT NOT NULL,
    since       REAL NOT NULL,
    deadline    REAL,            -- draining: when what still runs is stopped and requeued (NULL: never)
    drained_at  REAL,
    CHECK ((state = 'drained') = (drained_at IS NOT NULL))
) STRICT;
-- Upkeep looks only at the workers draining now.
CREATE INDEX worker_cordons_draining ON worker_cordons (worker_id) WHERE state = 'draining';

-- Per-GPU health as each worker's agent reports it from NVML (register and heartbeat `gpus`):
-- one row per device index. Placement reserves no unhealthy index (worker_load.free_gpus,
-- gpus_in_use). A GPU stays unhealthy until its agent registers again (a new worker row) or
-- an operator runs `gpulayer worker gpu-reset` (docs/workers.md, "Broken GPUs").
CREATE TABLE worker_gpus (
    worker_id      INTEGER NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
    "index"        INTEGER NOT NULL CHECK ("index" >= 0),
    uuid           TEXT,
    healthy        INTEGER NOT NULL DEFAULT 1 CHECK (healthy IN (0, 1)),
    reason         TEXT,             -- why not healthy (an Xid, ECC errors, no answer)
    changed_at     REAL NOT NULL,
    reset_pending  INTEGER NOT NULL DEFAULT 0 CHECK (reset_pending IN (0, 1)),  -- gpu-reset not told to the agent yet
    PRIMARY KEY (worker_id, "index"),
    CHECK (healthy = 1 OR reason IS NOT NULL)
) STRICT;
-- worker_load counts the unhealthy GPUs of each worker.
CREATE INDEX worker_gpus_unhealthy ON worker_gpus (worker_id) WHERE healthy = 0;

-- GPU use over time (issue 28 part 4): what each worker's agent measured of each GPU through NVML,
-- downsampled to one row per GPU per heartbeat interval (heartbeat `gpu_samples`: the mean
-- utilization and the peak memory used over the interval, `at` its end). The control plane keeps
-- them in memory and writes each upkeep tick's in one statement (scheduler/gpu_samples.py), so a
-- heartbeat stays off the write path. `gpu_index` is the worker's device index, as a task's `gpus`
-- name it; no foreign key: a worker pruned keeps its samples until their own retention
-- (`--gpu-sample-retention`, default 7 days). `job status` reads the newest of a task's GPUs; the
-- explorer charts them.
CREATE TABLE gpu_samples (
    worker_id        INTEGER NOT NULL,
    gpu_index        INTEGER NOT NULL,
    at               REAL NOT NULL,
    utilization_pct  REAL,      -- mean over the interval, 0 to 100 (NULL: NVML could not tell)
    memory_used_mb   INTEGER,   -- the most used during the interval, MiB
    memory_total_mb  INTEGER
) STRICT;
-- Retention prunes the oldest first; charts read a time window.
CREATE INDEX gpu_samples_at ON gpu_samples (at);
-- The newest sample of one GPU (`job status`), one GPU's series.
CREATE INDEX gpu_samples_gpu ON gpu_samples (worker_id, gpu_index, at);

-- ---------------------------------------------------------------------------------------
-- Jobs and tasks: jobs, tasks, job_dependencies.
-- ---------------------------------------------------------------------------------------

-- What users submitted. `spec` is the JobSpec as stored (normalised);
-- the requirement columns are copies of it that placement reads. A job array
-- (spec `array`) has `array_size` elements, each its own task ("index" is the
-- element's index, attempt its own retries), at most `max_running` (its %N) of
-- them queued-and-released or active at once; NULL for a job that is no array.
CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    name              TEXT,
    state             TEXT NOT NULL DEFAULT 'queued' CHECK (state IN (
                          'queued',     -- waiting for placement (or re-placement)
                          'running',    -- at least one task assigned or running
                          'succeeded',  -- every task exited 0
                          'failed',     -- a task failed or timed out and is not retried
                          'cancelled',  -- cancelled by a user
                          'lost',       -- a task was lost and is not retried
                          'waiting'     -- its dependencies (job_dependencies) have not all ended; tasks held
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
    user_id           INTEGER NOT NULL DEFAULT 1,
    project_id        INTEGER NOT NULL DEFAULT 1,
    preemptible       INTEGER NOT NULL DEFAULT 0 CHECK (preemptible IN (0, 1)),
    array_size        INTEGER CHECK (array_size IS NULL OR array_size >= 1),
    max_running       INTEGER CHECK (max_running IS NULL OR max_running >= 1)
    , hold INTEGER NOT NULL DEFAULT 0 CHECK (hold IN (0, 1)), begin_at REAL, revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1)

    , gpu_fraction REAL CHECK (gpu_fraction IS NULL OR (gpu_fraction > 0 AND gpu_fraction < 1))
    , gpu_memory_mb INTEGER CHECK (gpu_memory_mb IS NULL OR gpu_memory_mb > 0)
    , gpu_link TEXT CHECK (gpu_link IS NULL OR gpu_link = 'nvlink'),
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'lost')) = (finished_at IS NOT NULL))
) STRICT;
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_name ON jobs (name) WHERE name IS NOT NULL;
-- Gang placement looks only at queued multi-node jobs, best first.
CREATE INDEX jobs_queued_gangs ON jobs (priority DESC, id) WHERE state = 'queued' AND gang = 1;
-- `job list` (your jobs, a project's jobs) and the running-jobs limit read these.
CREATE INDEX jobs_user_state ON jobs (user_id, state);
-- A user's own jobs newest first (`job list`), without reading everyone else's.
CREATE INDEX jobs_user_id ON jobs (user_id, id);
CREATE INDEX jobs_project_state ON jobs (project_id, state);
-- `hold` (submit --hold, job hold): it waits until released; `begin_at` (submit --begin): it waits until
-- then. Upkeep releases the waiting jobs whose time came from this index alone (jobcontrol.begin_due).
CREATE INDEX jobs_begin_at ON jobs (begin_at) WHERE state = 'waiting' AND begin_at IS NOT NULL;

-- One row per replica / rank per attempt. A retry adds rows with attempt + 1;
-- the old rows stay as history. Leases are timestamps on the rows. An array's
-- element is a task whose "index" is the element's index; its retries add rows
-- with its own attempt + 1. `held` = 1: queued but not released (its job waits
-- for dependencies, or its array is at its %N cap), so not in task_queue. `queued_at`: when a held
-- task was released into the queue (NULL for one queued when created: created_at); aging counts from
-- it (task_queue.since). Written as ADD COLUMN wrote it, after the last column (before the CHECKs).
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
    held              INTEGER NOT NULL DEFAULT 0 CHECK (held IN (0, 1))
    , queued_at REAL, ahead INTEGER NOT NULL DEFAULT 0 CHECK (ahead IN (0, 1)), drain_deadline REAL, drain_started_at REAL, revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1)

    , gpu_share REAL NOT NULL DEFAULT 0 CHECK (gpu_share >= 0 AND gpu_share <= 1),
    CHECK ((state IN ('assigned', 'running')) = (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL)
           OR state NOT IN ('queued', 'assigned', 'running')),
    CHECK (state <> 'queued' OR worker_id IS NULL),
    CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'lost')) = (finished_at IS NOT NULL))
) STRICT;
-- `ahead`: an array element leased ahead (docs/protocol.md "Elements leased ahead"), assigned to a
-- worker that has not started it; it holds none of the worker's room (worker_load) and goes back to
-- the queue, same attempt, when the worker is lost, leaves, is cordoned or gives it back. Starting it and
-- every requeue clear it; an ended row may keep it (nothing reads it there).
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
-- The next held task of a job to release (an array below its cap, a job whose dependencies ended).
CREATE INDEX tasks_held ON tasks (job_id, "index") WHERE state = 'queued' AND held = 1;
-- Has a job any task left to run (an array ends when none is left: one probe, not a walk of its
-- elements), and which of its tasks hold a worker (a seek per state, not a walk of what waits)?
CREATE INDEX tasks_job_active ON tasks (job_id, state) WHERE state IN ('queued', 'assigned', 'running');
-- `drain_deadline`: a replica leaving its service (scale-down, a rolling update; issue 39): it is out of the
-- ingress's set from `drain_started_at`, its in-flight requests finish, and upkeep stops it (cancel_requested)
-- once none is left or at the deadline; it is not replaced and does not end its service
-- (scheduler/service_drain.py). NULL: not draining. The replicas draining now are a seek:
CREATE INDEX tasks_draining ON tasks (drain_deadline) WHERE drain_deadline IS NOT NULL AND state IN ('assigned', 'running');
-- Autoscaling decisions (service.autoscale): one row a change of a service's replica count, with what
-- made it (docs/services.md, "Autoscaling"): `why` up (load over target), down (under it), zero (idle,
-- released), wake (a request for a service at zero), min (below its min, e.g. after a replica was lost).
CREATE TABLE service_scaling (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL REFERENCES jobs (id),
    at            REAL NOT NULL,
    from_replicas INTEGER NOT NULL CHECK (from_replicas >= 0),
    to_replicas   INTEGER NOT NULL CHECK (to_replicas >= 0),
    why           TEXT NOT NULL CHECK (why IN ('up', 'down', 'zero', 'wake', 'min')),
    load          REAL,             -- requests in flight per ready replica through the ingress when decided
    in_flight     INTEGER,          -- requests in flight (and held for a cold start) in all
    ready         INTEGER           -- replicas ready (in the ingress's set) when decided
) STRICT;
CREATE INDEX service_scaling_job ON service_scaling (job_id, at);
-- The services that may scale (upkeep's autoscale step reads them each tick): a seek, not a walk of the jobs.
CREATE INDEX jobs_services_live ON jobs (id) WHERE kind = 'service' AND state IN ('queued', 'running');

-- Dependencies (`after`): job_id waits until after_job_id has ended. While any has not ended
-- the job is `waiting` and its tasks are held (outside task_queue, so waiting costs acquire
-- nothing); the transaction that ends the last releases it, and one that ends a dependency
-- against its condition cancels it (reason dependency_failed), which cascades. A dependency
-- names an existing job, so there are no cycles.
CREATE TABLE job_dependencies (
    job_id        INTEGER NOT NULL REFERENCES jobs (id),
    after_job_id  INTEGER NOT NULL REFERENCES jobs (id),
    condition     TEXT NOT NULL CHECK (condition IN (
                      'ok',      -- after_job_id succeeded
                      'notok',   -- it failed, was lost or was cancelled
                      'any'      -- it ended, however
                  )),
    PRIMARY KEY (job_id, after_job_id)
) STRICT;
-- The jobs waiting on a job that just ended.
CREATE INDEX job_dependencies_after ON job_dependencies (after_job_id);

-- ---------------------------------------------------------------------------------------
-- The queue: shapes (autoclusters) and task_queue, kept by triggers as tasks queue and leave.
-- ---------------------------------------------------------------------------------------

-- Queued work grouped by what it asks of a worker (HTCondor's autoclusters), so that
-- acquire judges the few shapes a worker fits instead of every queued task. One row per
-- distinct requirement, made when the first job asking for it is submitted (trigger
-- jobs_shape) and kept: job_worker_fit reads every job's fit through its shape.
-- `secrets` is '[]', or {"project": id, "names": [...]} for a job that uses secrets: the
-- same name is another secret in another project. `gpu_fraction` and `gpu_memory_mb`: a share of one GPU
-- (issue 40, docs/workers.md "Sharing a GPU"; 0 for none, `gpus` then 0; migration 0032 made the table
-- again, and task_queue with it, to add them to its key). `gpu_link`: 'nvlink' for a job that requires GPUs
-- joined by NVLink (docs/workers.md, "Topology"; migration 0035 made both again to add it to the key).
CREATE TABLE shapes (
    id           INTEGER PRIMARY KEY,
    gang         INTEGER NOT NULL CHECK (gang IN (0, 1)),
    gpus         INTEGER NOT NULL CHECK (gpus >= 0),
    gpu_fraction REAL NOT NULL DEFAULT 0 CHECK (gpu_fraction >= 0 AND gpu_fraction < 1),
    gpu_memory_mb INTEGER NOT NULL DEFAULT 0 CHECK (gpu_memory_mb >= 0),
    gpu_link     TEXT NOT NULL DEFAULT '' CHECK (gpu_link IN ('', 'nvlink')),  -- '' for no requirement
    cpus         REAL NOT NULL CHECK (cpus >= 0),
    memory_mb    INTEGER NOT NULL CHECK (memory_mb >= 0),
    accelerator  TEXT NOT NULL CHECK (accelerator IN ('', 'cuda')),  -- '' for none: NULLs are never equal in UNIQUE
    labels       TEXT NOT NULL CHECK (json_valid(labels)),
    secrets      TEXT NOT NULL CHECK (json_valid(secrets)),
    queued       INTEGER NOT NULL DEFAULT 0 CHECK (queued >= 0),     -- its rows in task_queue
    UNIQUE (gang, gpus, gpu_fraction, gpu_memory_mb, gpu_link, cpus, memory_mb, accelerator, labels, secrets)
) STRICT;
-- Acquire looks only at shapes with queued tasks.
CREATE INDEX shapes_queued ON shapes (id) WHERE queued > 0;

-- The queued tasks by shape, best first: a row exactly while its task is queued (and not held), kept by
-- the triggers below in the statement that queues or dequeues the task. project_id and user_id are
-- its job's, set by task_queue_group_in (written as ADD COLUMN wrote them, after the last column).
-- Aging (docs/teams.md): `since` is when the task became eligible (created, or released from held;
-- a task the scheduler took back, preempted or drained, keeps it), and upkeep raises `aged` one step
-- per hour waited, up to a cap (aging.AGING_STEP_S, AGING_MAX). Work is ordered by
-- `priority + aged`; preemption rights stay with `priority` alone.
CREATE TABLE task_queue (
    task_id   INTEGER PRIMARY KEY REFERENCES tasks (id),
    shape_id  INTEGER NOT NULL REFERENCES shapes (id),
    job_id    INTEGER NOT NULL,
    priority  INTEGER NOT NULL                      -- the task's (set at insert, never changed)
    , project_id INTEGER NOT NULL DEFAULT 1, user_id INTEGER NOT NULL DEFAULT 1
    , aged INTEGER NOT NULL DEFAULT 0 CHECK (aged >= 0), since REAL NOT NULL DEFAULT 0
) STRICT;
-- By shape, then project and user (queue_groups), best first (priority with its age): acquire takes
-- each admitted group's best task from here.
CREATE INDEX task_queue_shape ON task_queue (shape_id, project_id, user_id, priority + aged DESC, task_id);
-- Aging's upkeep: per step reached, the rows waiting long enough for the next (a seek per step).
CREATE INDEX task_queue_aging ON task_queue (aged, since);

CREATE TRIGGER jobs_shape AFTER INSERT ON jobs BEGIN
    INSERT OR IGNORE INTO shapes (gang, gpus, gpu_fraction, gpu_memory_mb, gpu_link, cpus, memory_mb, accelerator,
                                  labels, secrets)
    VALUES (new.gang, new.gpus, coalesce(new.gpu_fraction, 0), coalesce(new.gpu_memory_mb, 0), coalesce(new.gpu_link, ''),
            new.cpus, new.memory_mb, coalesce(new.accelerator, ''), new.labels,
            CASE WHEN new.secrets = '[]' THEN '[]'
                 ELSE json_object('project', new.project_id, 'names', json(new.secrets)) END);
END;
CREATE TRIGGER tasks_queued_insert AFTER INSERT ON tasks WHEN new.state = 'queued' AND new.held = 0 BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority, since)
    SELECT new.id, js.shape_id, new.job_id, new.priority, coalesce(new.queued_at, new.created_at)
    FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_queued_again AFTER UPDATE OF state, held ON tasks
WHEN new.state = 'queued' AND new.held = 0 AND NOT (old.state = 'queued' AND old.held = 0) BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority, since)
    SELECT new.id, js.shape_id, new.job_id, new.priority, coalesce(new.queued_at, new.created_at)
    FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_dequeued AFTER UPDATE OF state, held ON tasks
WHEN old.state = 'queued' AND old.held = 0 AND NOT (new.state = 'queued' AND new.held = 0) BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;
CREATE TRIGGER tasks_queued_delete AFTER DELETE ON tasks WHEN old.state = 'queued' AND old.held = 0 BEGIN
    DELETE FROM task_queue WHERE task_id = old.id;
END;
CREATE TRIGGER task_queue_count_in AFTER INSERT ON task_queue BEGIN
    UPDATE shapes SET queued = queued + 1 WHERE id = new.shape_id;
END;
CREATE TRIGGER task_queue_count_out AFTER DELETE ON task_queue BEGIN
    UPDATE shapes SET queued = queued - 1 WHERE id = old.shape_id;
END;

-- The task state machine: every change of tasks.state that some operation makes, and which
-- (the named queries in gpulayer/server/store/queries/). tasks_transition refuses any other change
-- (RAISE ABORT 'task_transition: FROM -> TO', the statement undone); an update that keeps the state
-- passes. succeeded, failed, cancelled and lost are final: a new attempt is a new row. Ops read it:
-- SELECT * FROM task_transitions.
CREATE TABLE task_transitions (
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    made_by     TEXT NOT NULL,  -- the named queries that make it
    PRIMARY KEY (from_state, to_state)
) STRICT, WITHOUT ROWID;
INSERT INTO task_transitions (from_state, to_state, made_by) VALUES
    ('queued', 'assigned', 'acquire_task, acquire_one (a worker claims it), assign_task (a gang), lease_ahead (an element leased ahead)'),
    ('queued', 'cancelled', 'cancel_element, cancel_queued_batch (a user cancels), stop_attempt_tasks (a sibling ended it), detach_running_tasks (a retry replaces the attempt), drain_queued_task (a replica drained before it was placed)'),
    ('assigned', 'queued', 'requeue_never_started, requeue_ahead, requeue_ahead_expired, requeue_preempted, requeue_drained_task, release_attempt'),
    ('assigned', 'running', 'start_task'),
    ('assigned', 'succeeded', 'finish_task (a finish that carries no start)'),
    ('assigned', 'failed', 'finish_task (it failed before its process started)'),
    ('assigned', 'cancelled', 'finish_task, cancel_element, cancel_queued_batch, stop_attempt_tasks, detach_running_tasks'),
    ('assigned', 'lost', 'finish_task (its worker stopped it), expire_task_leases, worker_tasks_lost'),
    ('running', 'queued', 'requeue_preempted, requeue_drained_task, release_attempt (a gang attempt goes back)'),
    ('running', 'succeeded', 'finish_task'),
    ('running', 'failed', 'finish_task'),
    ('running', 'cancelled', 'finish_task (a cancel or a requeue it obeyed), detach_running_tasks'),
    ('running', 'lost', 'finish_task (its worker stopped it, its GPU failed), lose_unreported_task, expire_task_leases, worker_tasks_lost');
-- RAISE takes a literal before SQLite 3.48 (the file stays readable by 3.40): the CASE names the
-- pair; the table alone says which pairs pass.
CREATE TRIGGER tasks_transition BEFORE UPDATE OF state ON tasks
WHEN new.state IS NOT old.state
     AND NOT EXISTS (SELECT 1 FROM task_transitions WHERE from_state = old.state AND to_state = new.state)
BEGIN
    SELECT CASE old.state || ' -> ' || new.state
        WHEN 'queued -> assigned' THEN RAISE(ABORT, 'task_transition: queued -> assigned')
        WHEN 'queued -> running' THEN RAISE(ABORT, 'task_transition: queued -> running')
        WHEN 'queued -> succeeded' THEN RAISE(ABORT, 'task_transition: queued -> succeeded')
        WHEN 'queued -> failed' THEN RAISE(ABORT, 'task_transition: queued -> failed')
        WHEN 'queued -> cancelled' THEN RAISE(ABORT, 'task_transition: queued -> cancelled')
        WHEN 'queued -> lost' THEN RAISE(ABORT, 'task_transition: queued -> lost')
        WHEN 'assigned -> queued' THEN RAISE(ABORT, 'task_transition: assigned -> queued')
        WHEN 'assigned -> running' THEN RAISE(ABORT, 'task_transition: assigned -> running')
        WHEN 'assigned -> succeeded' THEN RAISE(ABORT, 'task_transition: assigned -> succeeded')
        WHEN 'assigned -> failed' THEN RAISE(ABORT, 'task_transition: assigned -> failed')
        WHEN 'assigned -> cancelled' THEN RAISE(ABORT, 'task_transition: assigned -> cancelled')
        WHEN 'assigned -> lost' THEN RAISE(ABORT, 'task_transition: assigned -> lost')
        WHEN 'running -> queued' THEN RAISE(ABORT, 'task_transition: running -> queued')
        WHEN 'running -> assigned' THEN RAISE(ABORT, 'task_transition: running -> assigned')
        WHEN 'running -> succeeded' THEN RAISE(ABORT, 'task_transition: running -> succeeded')
        WHEN 'running -> failed' THEN RAISE(ABORT, 'task_transition: running -> failed')
        WHEN 'running -> cancelled' THEN RAISE(ABORT, 'task_transition: running -> cancelled')
        WHEN 'running -> lost' THEN RAISE(ABORT, 'task_transition: running -> lost')
        WHEN 'succeeded -> queued' THEN RAISE(ABORT, 'task_transition: succeeded -> queued')
        WHEN 'succeeded -> assigned' THEN RAISE(ABORT, 'task_transition: succeeded -> assigned')
        WHEN 'succeeded -> running' THEN RAISE(ABORT, 'task_transition: succeeded -> running')
        WHEN 'succeeded -> failed' THEN RAISE(ABORT, 'task_transition: succeeded -> failed')
        WHEN 'succeeded -> cancelled' THEN RAISE(ABORT, 'task_transition: succeeded -> cancelled')
        WHEN 'succeeded -> lost' THEN RAISE(ABORT, 'task_transition: succeeded -> lost')
        WHEN 'failed -> queued' THEN RAISE(ABORT, 'task_transition: failed -> queued')
        WHEN 'failed -> assigned' THEN RAISE(ABORT, 'task_transition: failed -> assigned')
        WHEN 'failed -> running' THEN RAISE(ABORT, 'task_transition: failed -> running')
        WHEN 'failed -> succeeded' THEN RAISE(ABORT, 'task_transition: failed -> succeeded')
        WHEN 'failed -> cancelled' THEN RAISE(ABORT, 'task_transition: failed -> cancelled')
        WHEN 'failed -> lost' THEN RAISE(ABORT, 'task_transition: failed -> lost')
        WHEN 'cancelled -> queued' THEN RAISE(ABORT, 'task_transition: cancelled -> queued')
        WHEN 'cancelled -> assigned' THEN RAISE(ABORT, 'task_transition: cancelled -> assigned')
        WHEN 'cancelled -> running' THEN RAISE(ABORT, 'task_transition: cancelled -> running')
        WHEN 'cancelled -> succeeded' THEN RAISE(ABORT, 'task_transition: cancelled -> succeeded')
        WHEN 'cancelled -> failed' THEN RAISE(ABORT, 'task_transition: cancelled -> failed')
        WHEN 'cancelled -> lost' THEN RAISE(ABORT, 'task_transition: cancelled -> lost')
        WHEN 'lost -> queued' THEN RAISE(ABORT, 'task_transition: lost -> queued')
        WHEN 'lost -> assigned' THEN RAISE(ABORT, 'task_transition: lost -> assigned')
        WHEN 'lost -> running' THEN RAISE(ABORT, 'task_transition: lost -> running')
        WHEN 'lost -> succeeded' THEN RAISE(ABORT, 'task_transition: lost -> succeeded')
        WHEN 'lost -> failed' THEN RAISE(ABORT, 'task_transition: lost -> failed')
        WHEN 'lost -> cancelled' THEN RAISE(ABORT, 'task_transition: lost -> cancelled')
        ELSE RAISE(ABORT, 'task_transition: not a task state')
    END;
END;

-- The job state machine, the same way: job_transitions lists every change of jobs.state that a
-- named query makes (finish_job's rows are what its WHERE admits: any of queued, running, waiting to
-- any end); jobs_transition refuses any other ('job_transition: FROM -> TO').
CREATE TABLE job_transitions (
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    made_by     TEXT NOT NULL,  -- the named queries that make it
    PRIMARY KEY (from_state, to_state)
) STRICT, WITHOUT ROWID;
INSERT INTO job_transitions (from_state, to_state, made_by) VALUES
    ('queued', 'waiting', 'hold_job (held before any task started)'),
    ('queued', 'running', 'mark_job_running, mark_jobs_running (a task was placed)'),
    ('running', 'queued', 'requeue_job_if_idle, requeue_job (no task holds a worker now), next_attempt (a retry)'),
    ('waiting', 'queued', 'release_job (its dependencies ended, its hold released, its begin time came)'),
    ('queued', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('queued', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('running', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'succeeded', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'failed', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'cancelled', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('waiting', 'lost', 'finish_job (a job ends: its tasks ended, it is cancelled, a dependency or its spec failed)'),
    ('succeeded', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('failed', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('cancelled', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)'),
    ('lost', 'queued', 'reopen_job (job requeue of an ended job: a new attempt)');
CREATE TRIGGER jobs_transition BEFORE UPDATE OF state ON jobs
WHEN new.state IS NOT old.state
     AND NOT EXISTS (SELECT 1 FROM job_transitions WHERE from_state = old.state AND to_state = new.state)
BEGIN
    SELECT CASE old.state || ' -> ' || new.state
        WHEN 'queued -> running' THEN RAISE(ABORT, 'job_transition: queued -> running')
        WHEN 'queued -> succeeded' THEN RAISE(ABORT, 'job_transition: queued -> succeeded')
        WHEN 'queued -> failed' THEN RAISE(ABORT, 'job_transition: queued -> failed')
        WHEN 'queued -> cancelled' THEN RAISE(ABORT, 'job_transition: queued -> cancelled')
        WHEN 'queued -> lost' THEN RAISE(ABORT, 'job_transition: queued -> lost')
        WHEN 'queued -> waiting' THEN RAISE(ABORT, 'job_transition: queued -> waiting')
        WHEN 'running -> queued' THEN RAISE(ABORT, 'job_transition: running -> queued')
        WHEN 'running -> succeeded' THEN RAISE(ABORT, 'job_transition: running -> succeeded')
        WHEN 'running -> failed' THEN RAISE(ABORT, 'job_transition: running -> failed')
        WHEN 'running -> cancelled' THEN RAISE(ABORT, 'job_transition: running -> cancelled')
        WHEN 'running -> lost' THEN RAISE(ABORT, 'job_transition: running -> lost')
        WHEN 'running -> waiting' THEN RAISE(ABORT, 'job_transition: running -> waiting')
        WHEN 'succeeded -> queued' THEN RAISE(ABORT, 'job_transition: succeeded -> queued')
        WHEN 'succeeded -> running' THEN RAISE(ABORT, 'job_transition: succeeded -> running')
        WHEN 'succeeded -> failed' THEN RAISE(ABORT, 'job_transition: succeeded -> failed')
        WHEN 'succeeded -> cancelled' THEN RAISE(ABORT, 'job_transition: succeeded -> cancelled')
        WHEN 'succeeded -> lost' THEN RAISE(ABORT, 'job_transition: succeeded -> lost')
        WHEN 'succeeded -> waiting' THEN RAISE(ABORT, 'job_transition: succeeded -> waiting')
        WHEN 'failed -> queued' THEN RAISE(ABORT, 'job_transition: failed -> queued')
        WHEN 'failed -> running' THEN RAISE(ABORT, 'job_transition: failed -> running')
        WHEN 'failed -> succeeded' THEN RAISE(ABORT, 'job_transition: failed -> succeeded')
        WHEN 'failed -> cancelled' THEN RAISE(ABORT, 'job_transition: failed -> cancelled')
        WHEN 'failed -> lost' THEN RAISE(ABORT, 'job_transition: failed -> lost')
        WHEN 'failed -> waiting' THEN RAISE(ABORT, 'job_transition: failed -> waiting')
        WHEN 'cancelled -> queued' THEN RAISE(ABORT, 'job_transition: cancelled -> queued')
        WHEN 'cancelled -> running' THEN RAISE(ABORT, 'job_transition: cancelled -> running')
        WHEN 'cancelled -> succeeded' THEN RAISE(ABORT, 'job_transition: cancelled -> succeeded')
        WHEN 'cancelled -> failed' THEN RAISE(ABORT, 'job_transition: cancelled -> failed')
        WHEN 'cancelled -> lost' THEN RAISE(ABORT, 'job_transition: cancelled -> lost')
        WHEN 'cancelled -> waiting' THEN RAISE(ABORT, 'job_transition: cancelled -> waiting')
        WHEN 'lost -> queued' THEN RAISE(ABORT, 'job_transition: lost -> queued')
        WHEN 'lost -> running' THEN RAISE(ABORT, 'job_transition: lost -> running')
        WHEN 'lost -> succeeded' THEN RAISE(ABORT, 'job_transition: lost -> succeeded')
        WHEN 'lost -> failed' THEN RAISE(ABORT, 'job_transition: lost -> failed')
        WHEN 'lost -> cancelled' THEN RAISE(ABORT, 'job_transition: lost -> cancelled')
        WHEN 'lost -> waiting' THEN RAISE(ABORT, 'job_transition: lost -> waiting')
        WHEN 'waiting -> queued' THEN RAISE(ABORT, 'job_transition: waiting -> queued')
        WHEN 'waiting -> running' THEN RAISE(ABORT, 'job_transition: waiting -> running')
        WHEN 'waiting -> succeeded' THEN RAISE(ABORT, 'job_transition: waiting -> succeeded')
        WHEN 'waiting -> failed' THEN RAISE(ABORT, 'job_transition: waiting -> failed')
        WHEN 'waiting -> cancelled' THEN RAISE(ABORT, 'job_transition: waiting -> cancelled')
        WHEN 'waiting -> lost' THEN RAISE(ABORT, 'job_transition: waiting -> lost')
        ELSE RAISE(ABORT, 'job_transition: not a job state')
    END;
END;

-- ---------------------------------------------------------------------------------------
-- Events and logs.
-- ---------------------------------------------------------------------------------------

-- Append-only log of every state change, written in the same transaction as
-- the change, so the two never disagree. A seq is never given out again, even
-- once retention pruned the newest events (AUTOINCREMENT): webhooks' cursors and
-- `webhook-id`s (msg_gl<webhook>e<seq>) rely on it.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         REAL NOT NULL,
    kind       TEXT NOT NULL,
    job_id     INTEGER,
    task_id    INTEGER,
    worker_id  INTEGER,
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    actor      TEXT
) STRICT;
CREATE INDEX events_job ON events (job_id, seq) WHERE job_id IS NOT NULL;
CREATE INDEX events_kind_at ON events (kind, at);

-- Streams through the relay (issue 26: `gpulayer exec`, later shells, port-forwards): one row per
-- stream, written when it opens and when it closes (never per byte: the bytes go through the relay's
-- asyncio loop, not the writer), each time with a `session_opened` / `session_closed` event.
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

-- Notifications (issue 28, docs/notifications.md): who is told of what. A webhook is an outbox over
-- `events`: `cursor` is the last event seq it has handled (delivered, given up on, or not its own),
-- advanced only in a write after the receiver's 2xx, so a restart (or SIGKILL) resumes there. A row
-- with `email` instead of `url` is a mailbox (`submit --mail-user`, `alert add --email`). `scope`
-- says whose events: all (admins), the adder's own jobs (user), a project's, one job's, or one
-- alert's (its `alert.fired` events only). `secret` is the `whsec_` signing secret, sealed like a
-- secret's value (security/secretbox.py). Ids are never reused (AUTOINCREMENT): a webhook's id is half
-- of each `webhook-id` it sends (msg_gl<webhook>e<event>), which receivers deduplicate on.
CREATE TABLE webhooks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    url         TEXT,
    email       TEXT,
    events      TEXT NOT NULL CHECK (json_valid(events)),   -- public names: ["job.failed", ...]
    format      TEXT NOT NULL DEFAULT 'standard' CHECK (format IN ('standard', 'slack', 'email')),
    scope       TEXT NOT NULL CHECK (scope IN ('all', 'user', 'project', 'job', 'alert')),
    project_id  INTEGER,
    job_id      INTEGER,
    alert_id    INTEGER,
    user_id     INTEGER NOT NULL,
    secret      BLOB,
    cursor      INTEGER NOT NULL DEFAULT 0 CHECK (cursor >= 0),
    created_at  REAL NOT NULL
    , disabled TEXT,
    CHECK ((url IS NULL) <> (email IS NULL)),
    CHECK (scope <> 'project' OR project_id IS NOT NULL),
    CHECK (scope <> 'job' OR job_id IS NOT NULL),
    CHECK (scope <> 'alert' OR alert_id IS NOT NULL)
) STRICT;
CREATE INDEX webhooks_job ON webhooks (job_id) WHERE job_id IS NOT NULL;

-- What each webhook's deliveries did: one row per (webhook, event) tried; `retrying` until a 2xx
-- (`delivered`) or until the retry window (`--webhook-retry-for`, 24 h) ran out (`failed`, skipped).
CREATE TABLE webhook_deliveries (
    webhook_id    INTEGER NOT NULL,
    event_seq     INTEGER NOT NULL,
    event         TEXT NOT NULL,                     -- the public name: job.failed
    status        TEXT NOT NULL CHECK (status IN ('retrying', 'delivered', 'failed')),
    attempts      INTEGER NOT NULL CHECK (attempts >= 1),
    first_try_at  REAL NOT NULL,
    last_try_at   REAL NOT NULL,
    next_try_at   REAL,                              -- retrying: not before then
    http_status   INTEGER,
    last_error    TEXT,
    PRIMARY KEY (webhook_id, event_seq),
    CHECK (status <> 'retrying' OR next_try_at IS NOT NULL)
) STRICT;
CREATE INDEX webhook_deliveries_status ON webhook_deliveries (status, last_try_at);
-- The outbox's look at each webhook's delivery being retried, every tick (due_webhooks): without it, a
-- walk of all the webhook's rows, which --job-retention keeps (8 ms a tick at 100 rows for 1,000 webhooks).
CREATE INDEX webhook_deliveries_retrying ON webhook_deliveries (webhook_id) WHERE status = 'retrying';

-- Alerts: a read-only query run every `every_s` (admins'); it fires (an `alert_fired` event,
-- delivered to `webhook_id`) when it returns rows it did not return last time. `seen`: the digests
-- of the rows it returned last time. Ids are never reused: `alert_id` names the alert to receivers.
CREATE TABLE alerts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT NOT NULL UNIQUE,
    sql          TEXT NOT NULL,
    every_s      REAL NOT NULL CHECK (every_s >= 1),
    webhook_id   INTEGER NOT NULL,
    user_id      INTEGER NOT NULL,
    seen         TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(seen)),
    next_run_at  REAL NOT NULL,
    last_run_at  REAL,
    last_error   TEXT,
    fired        INTEGER NOT NULL DEFAULT 0 CHECK (fired >= 0),
    created_at   REAL NOT NULL
) STRICT;

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

-- ---------------------------------------------------------------------------------------
-- Artifacts, rendezvous, secrets, provisioning.
-- ---------------------------------------------------------------------------------------

-- Content-addressed blobs under $GPULAYER_HOME/artifacts; the bytes live in
-- files, this table says what is there. `named_at`: when a job first named it (submit); until then
-- it counts against its uploaders' quotas and the sweep removes it after `--unnamed-retention`.
CREATE TABLE artifacts (
    digest       TEXT PRIMARY KEY CHECK (digest GLOB 'sha256:*'),
    size         INTEGER NOT NULL CHECK (size >= 0),
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL
    , named_at REAL
) STRICT;

-- Who uploaded an artifact's bytes (issue 36): a digest is no read capability of its own. A user
-- reads what it uploaded or what a job it may read names, a worker what it uploaded or what its
-- tasks name; a job or a checkpoint names only what its caller may read (access.sql).
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
-- The quotas: a project's uploads; the sweep forgets an artifact's uploads with it.
CREATE INDEX artifact_uploads_project ON artifact_uploads (project_id) WHERE project_id IS NOT NULL;
CREATE INDEX artifact_uploads_digest ON artifact_uploads (digest);

-- Checkpoints (issue 27, docs/training.md): what a task's GPULAYER_CHECKPOINT_DIR held when its
-- agent uploaded it, per job and element or rank (`index`), so that the next attempt, on any
-- worker, starts with the last one restored. A row is written only once every file's artifact is
-- stored (the record checks `artifacts`), so a partial upload never replaces the last complete
-- one. `kind`: 'periodic' (every --checkpoint-every, its own write) or 'final' (with the finish of
-- an attempt that did not succeed, in the same transaction). The newest `checkpoint_keep` per
-- (job_id, index) are kept (`server start --checkpoint-keep`); the artifact sweep keeps their files.
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
-- key is in a 0600 file beside the server secret, never in this file). A secret
-- belongs to a project: a job reads only its own project's.
CREATE TABLE secrets (
    project_id  INTEGER NOT NULL DEFAULT 1 REFERENCES projects (id),
    name        TEXT NOT NULL,
    labels      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),
    ciphertext  BLOB NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (project_id, name)
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

-- ---------------------------------------------------------------------------------------
-- Views for the questions ops ask: endpoints, job_summary, worker_load.
-- ---------------------------------------------------------------------------------------

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

-- What each worker has and what is free on it now (an unhealthy GPU is never free). Fractions of a GPU
-- (schema 32, docs/workers.md "Sharing a GPU"): `gpu_sharing` the worker's mode (`worker start
-- --gpu-sharing`); `shared_gpus` the healthy GPUs its fractional tasks hold (tasks.gpu_share > 0), which are
-- no longer free for a whole-GPU task; `gpu_share_used` the shares those tasks hold, in GPUs; `share_room`
-- the largest share left on one of those GPUs (0 when none), which one more fractional task may take
-- there (a free whole GPU offers 1).
CREATE VIEW worker_load AS
SELECT w.id AS worker_id, w.name, w.state, w.labels, w.slots, w.gpus, w.cpus, w.memory_mb,
       count(t.id) AS active_tasks,
       w.slots - count(t.id) AS free_slots,
       w.gpus - coalesce(sum(j.gpus), 0)
           - (SELECT count(*) FROM worker_gpus g WHERE g.worker_id = w.id AND g.healthy = 0)
           - (SELECT count(DISTINCT x.value) FROM tasks f, json_each(f.gpu_indices) x
              WHERE f.worker_id = w.id AND f.state IN ('assigned', 'running') AND f.gpu_share > 0
                AND NOT EXISTS (SELECT 1 FROM worker_gpus g
                                WHERE g.worker_id = w.id AND g."index" = x.value AND g.healthy = 0)) AS free_gpus,
       w.cpus - coalesce(sum(j.cpus), 0) AS free_cpus,
       w.memory_mb - coalesce(sum(j.memory_mb), 0) AS free_memory_mb,
       w.last_seen_at, w.lease_expires_at,
       (SELECT count(*) FROM worker_gpus g WHERE g.worker_id = w.id AND g.healthy = 0) AS unhealthy_gpus,
       w.gpu_sharing,
       (SELECT count(DISTINCT x.value) FROM tasks f, json_each(f.gpu_indices) x
        WHERE f.worker_id = w.id AND f.state IN ('assigned', 'running') AND f.gpu_share > 0) AS shared_gpus,
       coalesce(sum(t.gpu_share), 0) AS gpu_share_used,
       coalesce((SELECT max(1 - u.used) FROM (
                     SELECT x.value AS i, sum(f.gpu_share) AS used FROM tasks f, json_each(f.gpu_indices) x
                     WHERE f.worker_id = w.id AND f.state IN ('assigned', 'running') AND f.gpu_share > 0
                     GROUP BY x.value) u
                 WHERE NOT EXISTS (SELECT 1 FROM worker_gpus g
                                   WHERE g.worker_id = w.id AND g."index" = u.i AND g.healthy = 0)), 0) AS share_room
FROM workers w
LEFT JOIN tasks t ON t.worker_id = w.id AND t.state IN ('assigned', 'running') AND t.ahead = 0
LEFT JOIN jobs j ON j.id = t.job_id
GROUP BY w.id;

-- ---------------------------------------------------------------------------------------
-- Fit: which workers a shape and a job fit, and why not (job_shape, shape_worker_fit,
-- job_worker_fit).
-- ---------------------------------------------------------------------------------------

-- The shape of each job (shapes: the requirement its placement reads).
CREATE VIEW job_shape AS
SELECT j.id AS job_id, j.state AS job_state, s.id AS shape_id
FROM jobs j
JOIN shapes s ON s.gang = j.gang AND s.gpus = j.gpus AND s.cpus = j.cpus AND s.memory_mb = j.memory_mb
             AND s.gpu_fraction = coalesce(j.gpu_fraction, 0) AND s.gpu_memory_mb = coalesce(j.gpu_memory_mb, 0)
             AND s.gpu_link = coalesce(j.gpu_link, '')
             AND s.accelerator = coalesce(j.accelerator, '') AND s.labels = j.labels
             AND s.secrets = CASE WHEN j.secrets = '[]' THEN '[]'
                                  ELSE json_object('project', j.project_id, 'names', json(j.secrets)) END;

-- Which workers a shape of work fits, and why not: the one definition of fit, which
-- job_worker_fit reads for jobs and acquisition for queued shapes. One row per shape and
-- worker, whatever the worker's state. Flags are 0 or 1:
--   has_labels       every label the shape asks for is on the worker, with the same value; a
--                    `gpu_model` label (`submit --gpu-model`) is also met by a worker with a GPU
--                    or MIG instance of that model (its `gpu_models`, by index: "1g.10gb",
--                    "NVIDIA H100 ..."); then only GPUs of that model count for it, below
--   has_accelerator  the shape asks for none, or the worker has GPUs
--   big_enough       the worker's GPUs, CPUs and memory cover one task, when idle; a task of
--                    more than one GPU counts only whole GPUs, never MIG instances (a CUDA
--                    process uses one MIG instance: worker_gpus rows whose uuid is MIG-...);
--                    a `gpu_model` met by the GPUs (not by a worker label) counts those of it;
--                    a `gpu_link` nvlink shape (schema 35), those of one NVLink set
--                    (workers.gpu_nvlink: each GPU's set, null for a GPU without NVLink)
--   missing_secret   the first of the shape's secrets (by name) that is not set in its project
--                    or whose labels the worker's join token does not all carry; NULL when it
--                    may have them all
--   fits             all four: the worker could run a task of the shape when idle
--   has_room         a free slot, and free GPUs, CPUs and memory for one task now (worker_load);
--                    for more than one GPU on a worker with MIG instances, as many free whole
--                    GPUs (healthy, held by no task); for a `gpu_model` met by the GPUs, as
--                    many free GPUs of that model; for `gpu_link` nvlink, as many free GPUs of
--                    one NVLink set (healthy, held by no task)
--   schedulable      not cordoned, draining or drained (worker_cordons)
--   fits_now         online, schedulable, fits, has room: it could take a task of the shape of
--                    a job it holds no task of (job_worker_fit.holds_task)
--   spare_gpus       free GPUs left after one task (gang placement packs the tightest first)
--   free_slots, free_gpus, free_cpus, free_memory_mb   the worker's free room now (worker_load)
--   by_index         a task's GPU indices are picked among some of the free ones: whole GPUs beside
--                    MIG instances, or those of a `gpu_model` met by the GPUs; so its room is no sum;
--                    and a fractional task's (its GPU is picked by best fit: placement.py), and a
--                    `gpu_link` nvlink task's (one NVLink set's: a batch claim takes it first or not)
--   gpu_share        a fractional shape's share of one of the worker's GPUs (schema 32): its
--                    `gpu_fraction`, or its `gpu_memory_mb` over the worker's GPU memory if more;
--                    0 for whole GPUs. It fits a worker that shares its GPUs (`gpu_sharing`, not
--                    `off`) with the memory asked for on a GPU, and has room there while
--                    worker_load's share_room, or a free whole GPU, holds it
CREATE VIEW shape_worker_fit AS
SELECT p.*,
       (p.has_labels AND p.has_accelerator AND p.big_enough AND p.missing_secret IS NULL) AS fits,
       (p.worker_state = 'online' AND p.schedulable AND p.has_labels AND p.has_accelerator AND p.big_enough
        AND p.missing_secret IS NULL AND p.has_room) AS fits_now
FROM (
    SELECT s.id AS shape_id, s.gang, s.queued, l.worker_id, w.state AS worker_state,
           (s.labels = '{}' OR NOT EXISTS (
               SELECT 1 FROM json_each(s.labels) jl
               WHERE NOT EXISTS (SELECT 1 FROM json_each(w.labels) wl
                                 WHERE wl.key = jl.key AND wl.value = jl.value)
                 AND NOT (jl.key = 'gpu_model'  -- a GPU (or MIG instance) of that model at least
                          AND EXISTS (SELECT 1 FROM json_each(w.gpu_models) m WHERE m.value = jl.value))))
           AS has_labels,
           (s.accelerator = '' OR w.gpus > 0) AS has_accelerator,
           (s.gpus <= w.gpus AND s.cpus <= w.cpus AND s.memory_mb <= w.memory_mb
            AND (s.gpus <= 1 OR s.gpus <= w.gpus - (SELECT count(*) FROM worker_gpus g
                                                    WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*'))
            AND ((s.gpu_fraction = 0 AND s.gpu_memory_mb = 0)  -- a share: a GPU shared, with the memory asked
                 OR (w.gpu_sharing <> 'off' AND w.gpus > 0
                     AND (s.gpu_memory_mb = 0 OR s.gpu_memory_mb <= w.gpu_memory_mb)))
            AND (s.gpus = 0 OR s.labels = '{}' OR json_extract(s.labels, '$.gpu_model') IS NULL
                 OR json_extract(s.labels, '$.gpu_model') IS json_extract(w.labels, '$.gpu_model')
                 OR s.gpus <= (SELECT count(*) FROM json_each(w.gpu_models) m  -- its GPUs of that model
                               WHERE m.value = json_extract(s.labels, '$.gpu_model')
                                 AND (s.gpus = 1 OR NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                                WHERE g.worker_id = w.id AND g."index" = m.key
                                                                  AND g.uuid GLOB 'MIG-*')))))
           AND CASE WHEN s.gpu_link = '' THEN 1  -- `gpu_link` nvlink: as many whole GPUs of one NVLink set
                    ELSE s.gpus <= (SELECT coalesce(max(d.n), 0) FROM (
                        SELECT count(*) AS n FROM json_each(w.gpu_nvlink) v
                        WHERE v.value IS NOT NULL
                          AND NOT EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g."index" = v.key
                                                                        AND g.uuid GLOB 'MIG-*')
                        GROUP BY v.value) d) END
           AS big_enough,
           CASE WHEN s.secrets <> '[]' THEN (
               SELECT sv.value FROM json_each(s.secrets, '$.names') sv
               LEFT JOIN secrets sc ON sc.project_id = json_extract(s.secrets, '$.project') AND sc.name = sv.value
               WHERE sc.name IS NULL  -- deleted since submit: wait until it is set again
                  OR EXISTS (SELECT 1 FROM json_each(sc.labels) sl
                             WHERE NOT EXISTS (SELECT 1 FROM json_each(w.token_labels) tl
                                               WHERE tl.key = sl.key AND tl.value = sl.value))
               ORDER BY sv.value LIMIT 1)
           END AS missing_secret,
           (l.free_slots > 0 AND s.gpus <= l.free_gpus AND s.cpus <= l.free_cpus
            AND s.memory_mb <= l.free_memory_mb
            AND (s.gpus <= 1
                 OR NOT EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*')
                 OR s.gpus <= w.gpus  -- the free whole GPUs: neither MIG nor unhealthy, nor held by a task
                              - (SELECT count(*) FROM worker_gpus g
                                 WHERE g.worker_id = w.id AND (g.healthy = 0 OR g.uuid GLOB 'MIG-*'))
                              - (SELECT count(DISTINCT x.value) FROM tasks t, json_each(t.gpu_indices) x
                                 WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')
                                   AND NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                   WHERE g.worker_id = w.id AND g."index" = x.value
                                                     AND (g.healthy = 0 OR g.uuid GLOB 'MIG-*'))))
            AND (s.gpus = 0 OR s.labels = '{}' OR json_extract(s.labels, '$.gpu_model') IS NULL
                 OR json_extract(s.labels, '$.gpu_model') IS json_extract(w.labels, '$.gpu_model')
                 OR s.gpus <= (SELECT count(*) FROM json_each(w.gpu_models) m  -- its free GPUs of that model
                               WHERE m.value = json_extract(s.labels, '$.gpu_model')
                                 AND NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                 WHERE g.worker_id = w.id AND g."index" = m.key
                                                   AND (g.healthy = 0 OR (s.gpus > 1 AND g.uuid GLOB 'MIG-*')))
                                 AND NOT EXISTS (SELECT 1 FROM tasks t, json_each(t.gpu_indices) x
                                                 WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')
                                                   AND x.value = m.key))))
            AND ((s.gpu_fraction = 0 AND s.gpu_memory_mb = 0)  -- a share: room on a shared GPU, or a free one
                 OR max(s.gpu_fraction, CASE WHEN w.gpu_memory_mb > 0 THEN s.gpu_memory_mb * 1.0 / w.gpu_memory_mb
                                             ELSE 0 END)
                    <= max(l.share_room, l.free_gpus >= 1) + 1e-9)
            AND CASE WHEN s.gpu_link = '' THEN 1  -- `gpu_link` nvlink: as many free GPUs of one NVLink set
                     ELSE s.gpus <= (SELECT coalesce(max(d.n), 0) FROM (
                         SELECT count(*) AS n FROM json_each(w.gpu_nvlink) v
                         WHERE v.value IS NOT NULL
                           AND NOT EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g."index" = v.key
                                                                         AND (g.healthy = 0 OR g.uuid GLOB 'MIG-*'))
                           AND NOT EXISTS (SELECT 1 FROM tasks t, json_each(t.gpu_indices) x
                                           WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')
                                             AND x.value = v.key)
                         GROUP BY v.value) d) END AS has_room,
           l.free_gpus - s.gpus AS spare_gpus, l.free_slots, l.free_gpus, l.free_cpus, l.free_memory_mb,
           (s.gpus > 1 AND EXISTS (SELECT 1 FROM worker_gpus g WHERE g.worker_id = w.id AND g.uuid GLOB 'MIG-*'))
           OR (s.gpus > 0 AND json_extract(s.labels, '$.gpu_model') IS NOT NULL
               AND json_extract(s.labels, '$.gpu_model') IS NOT json_extract(w.labels, '$.gpu_model'))
           OR s.gpu_fraction > 0 OR s.gpu_memory_mb > 0 OR s.gpu_link <> '' AS by_index,
           max(s.gpu_fraction, CASE WHEN w.gpu_memory_mb > 0 THEN s.gpu_memory_mb * 1.0 / w.gpu_memory_mb
                                    ELSE 0 END) AS gpu_share,
           NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id) AS schedulable
    FROM shapes s, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;

-- Which workers a job fits, and why not: shape_worker_fit for the job's shape, read by
-- acquire's waiting reasons, gang placement, provisioning and the explorer. One row per
-- job and worker, whatever their states (filter on job_state / worker_state). The flags
-- are its shape's (above), and:
--   holds_task       it holds an active task of the job already (one replica per worker; an
--                    array's elements are independent tasks, so never for an array)
--   fits_now         online, fits, has room, holds none: acquire would give it a task of the job
CREATE VIEW job_worker_fit AS
SELECT p.job_id, p.job_state, p.worker_id, p.worker_state, p.has_labels, p.has_accelerator,
       p.big_enough, p.missing_secret, p.has_room, p.holds_task, p.spare_gpus, p.fits,
       (p.shape_fits_now AND NOT p.holds_task) AS fits_now
FROM (
    SELECT js.job_id, js.job_state, f.worker_id, f.worker_state, f.has_labels, f.has_accelerator,
           f.big_enough, f.missing_secret, f.has_room, f.spare_gpus, f.fits, f.fits_now AS shape_fits_now,
           (EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's (an array's many)
                    WHERE o.worker_id = f.worker_id AND +o.job_id = js.job_id
                      AND o.state IN ('assigned', 'running'))
            AND (SELECT a.array_size FROM jobs a WHERE a.id = js.job_id) IS NULL) AS holds_task
    FROM job_shape js
    JOIN shape_worker_fit f ON f.shape_id = js.shape_id
) p;

-- ---------------------------------------------------------------------------------------
-- Quotas, borrowing, fair share, priority classes (issue 15, part B; docs/teams.md explains
-- the rules): queue_groups, scheduler_settings, fairshare.
-- ---------------------------------------------------------------------------------------

-- Queued work by shape, project and user: acquire judges a project's GPU quota and a user's
-- running-jobs limit once per group, then takes each admitted group's best task
-- (task_queue_shape), so the queued tasks of a project at its quota cost it nothing. A row
-- while its group has queued tasks, kept by the two triggers below.
CREATE TABLE queue_groups (
    shape_id    INTEGER NOT NULL,
    project_id  INTEGER NOT NULL,
    user_id     INTEGER NOT NULL,
    queued      INTEGER NOT NULL CHECK (queued >= 0),  -- its rows in task_queue
    PRIMARY KEY (shape_id, project_id, user_id)
) STRICT;

CREATE TRIGGER task_queue_group_in AFTER INSERT ON task_queue BEGIN
    UPDATE task_queue SET (project_id, user_id) = (SELECT j.project_id, j.user_id FROM jobs j WHERE j.id = new.job_id)
    WHERE task_id = new.task_id;
    INSERT INTO queue_groups (shape_id, project_id, user_id, queued)
    SELECT new.shape_id, j.project_id, j.user_id, 1 FROM jobs j WHERE j.id = new.job_id
    ON CONFLICT (shape_id, project_id, user_id) DO UPDATE SET queued = queued + 1;
END;
CREATE TRIGGER task_queue_group_out AFTER DELETE ON task_queue BEGIN
    UPDATE queue_groups SET queued = queued - 1
    WHERE shape_id = old.shape_id AND project_id = old.project_id AND user_id = old.user_id;
    DELETE FROM queue_groups
    WHERE shape_id = old.shape_id AND project_id = old.project_id AND user_id = old.user_id AND queued = 0;
END;

-- Settings the scheduler's SQL reads: one row, written by the control plane at start
-- (`server start --fairshare-half-life`, `--preempt-grace`, `--default-runtime`, `--backfill`,
-- `--backfill-depth`, `--backfill-max-jobs`; the last four added by ADD COLUMN, written as it wrote them).
CREATE TABLE scheduler_settings (
    id                     INTEGER PRIMARY KEY CHECK (id = 1),
    fairshare_half_life_s  REAL NOT NULL CHECK (fairshare_half_life_s > 0),
    preempt_grace_s        REAL NOT NULL CHECK (preempt_grace_s >= 0)
    , default_runtime_s REAL NOT NULL DEFAULT 3600 CHECK (default_runtime_s > 0)
    , backfill INTEGER NOT NULL DEFAULT 1 CHECK (backfill IN (0, 1))
    , backfill_depth INTEGER NOT NULL DEFAULT 1 CHECK (backfill_depth BETWEEN 1 AND 100)
    , backfill_max_jobs INTEGER NOT NULL DEFAULT 100 CHECK (backfill_max_jobs BETWEEN 1 AND 100000)
) STRICT;
INSERT INTO scheduler_settings (id, fairshare_half_life_s, preempt_grace_s) VALUES (1, 604800, 30);

-- The time of the claim in progress: one row, written by placement's claim transaction before it
-- reads (queries/placement.sql, set_claim_clock), so that the fair-share views below decay usage to
-- the claim's `now`, and claimable_tasks reads `depth` tasks of each group (1 for one task, one more
-- than it may take for several); a view takes no parameter, and a temp table cannot be read from a
-- view in main. Outside a claim it holds the last claim's: read the views only there. `worker_id`: the
-- worker a claim is for (set_claim_worker), whose reservations alone claimable_tasks reads the room of;
-- NULL (set_claim_clock): every worker's.
-- (`depth` and `worker_id` were added by ADD COLUMN, written as it wrote them, after the last column.)
CREATE TABLE claim_clock (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    now  REAL NOT NULL
    , depth INTEGER NOT NULL DEFAULT 1 CHECK (depth BETWEEN 1 AND 17)
    , worker_id INTEGER
) STRICT;
INSERT INTO claim_clock (id, now) VALUES (1, 0);

-- Fair share: what each user used in each project, in GPU-seconds (CPU-seconds for a task
-- without GPUs): `usage`, of the runs that ended, decayed by the half-life to `updated_at`
-- (written with the usage row in the transaction that ends a run), plus `running`, of the runs
-- still going so far (rewritten by upkeep every few seconds). Acquire orders work of the same
-- priority by its project's usage over the project's share, then its user's.
CREATE TABLE fairshare (
    project_id  INTEGER NOT NULL,
    user_id     INTEGER NOT NULL,
    usage       REAL NOT NULL CHECK (usage >= 0),
    updated_at  REAL NOT NULL,
    running     REAL NOT NULL DEFAULT 0 CHECK (running >= 0),
    PRIMARY KEY (project_id, user_id)
) STRICT;

-- ---------------------------------------------------------------------------------------
-- The usage ledger: usage, written as each run ends.
-- ---------------------------------------------------------------------------------------

-- The usage ledger (accounting, like Slurm's sacct): one row per task run, written in the
-- transaction that ends the run (finish, loss, preemption, a gang sent back to the queue).
-- No reference to jobs or tasks: it outlives their retention. A task that never started
-- ran nothing and has no row. `project_name` is NULL while the project exists; removing it
-- writes its name there, so its runs keep the name (a later project may get its id).
CREATE TABLE usage (
    id            INTEGER PRIMARY KEY,
    task_id       INTEGER NOT NULL,
    job_id        INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    job_name      TEXT,
    labels        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels)),  -- the job's
    user_id       INTEGER NOT NULL,
    project_id    INTEGER NOT NULL,
    worker_id     INTEGER,
    worker_name   TEXT,
    gpus          INTEGER NOT NULL CHECK (gpus >= 0),
    cpus          REAL NOT NULL CHECK (cpus >= 0),
    started_at    REAL NOT NULL,
    ended_at      REAL NOT NULL,
    gpu_seconds   REAL NOT NULL CHECK (gpu_seconds >= 0),
    cpu_seconds   REAL NOT NULL CHECK (cpu_seconds >= 0),
    outcome       TEXT NOT NULL CHECK (outcome IN (
                      'succeeded', 'failed', 'timed_out', 'cancelled', 'lost',
                      'preempted',  -- stopped to make room; the task went back to the queue, same attempt
                      'requeued'    -- a gang sent back to the queue whole (a rank not started in time)
                  )),
    preempted_by  INTEGER, project_name TEXT,          -- the task that needed the room (outcome preempted)
    CHECK (ended_at >= started_at)
) STRICT;
CREATE INDEX usage_ended ON usage (ended_at);
-- A new project's id is past every project id the ledger names (insert_project).
CREATE INDEX usage_project ON usage (project_id);
-- job_runtime_model reads a user's latest runs of a job name (or of unnamed jobs) from here.
CREATE INDEX usage_user_name ON usage (user_id, job_name, ended_at);
-- Preemption's first question each round: the lowest priority of running preemptible work.
CREATE INDEX jobs_running_preemptible ON jobs (priority) WHERE state = 'running' AND preemptible = 1;

-- A run that ended (finish, loss, cancel, a GPU gone bad, a restore's reconciliation: any
-- statement that ends a running task) gets its usage row and its charge to fair share in that
-- same statement (GPU-seconds: a fractional task's share of the time, tasks.gpu_share). A run sent back to the queue instead (a preemption, a gang released) has no
-- finished_at: the scheduler writes its row (query insert_usage) before it requeues the task.
CREATE TRIGGER tasks_run_ended AFTER UPDATE OF state ON tasks
WHEN old.state = 'running' AND new.finished_at IS NOT NULL AND old.started_at IS NOT NULL BEGIN
    INSERT INTO usage (task_id, job_id, attempt, job_name, labels, user_id, project_id, worker_id, worker_name,
                       gpus, cpus, started_at, ended_at, gpu_seconds, cpu_seconds, outcome)
    SELECT new.id, new.job_id, new.attempt, j.name, j.labels, j.user_id, j.project_id, old.worker_id, w.name,
           j.gpus, j.cpus, old.started_at, max(new.finished_at, old.started_at),
           (j.gpus + old.gpu_share) * max(new.finished_at - old.started_at, 0),
           j.cpus * max(new.finished_at - old.started_at, 0),
           CASE WHEN new.outcome = 'timed_out' THEN 'timed_out' ELSE new.state END
    FROM jobs j LEFT JOIN workers w ON w.id = old.worker_id
    WHERE j.id = new.job_id;
    INSERT INTO fairshare (project_id, user_id, usage, updated_at)
    SELECT j.project_id, j.user_id,
           CASE WHEN j.gpus + old.gpu_share > 0 THEN j.gpus + old.gpu_share ELSE j.cpus END
           * max(new.finished_at - old.started_at, 0), new.finished_at
    FROM jobs j WHERE j.id = new.job_id
    ON CONFLICT (project_id, user_id) DO UPDATE
    SET usage = usage * pow(0.5, max(excluded.updated_at - updated_at, 0)
                                 / (SELECT fairshare_half_life_s FROM scheduler_settings)) + excluded.usage,
        updated_at = max(updated_at, excluded.updated_at);
END;

-- ---------------------------------------------------------------------------------------
-- Preemption: preemptions, gang_reservations.
-- ---------------------------------------------------------------------------------------

-- Preemptions: a row per victim, written when the scheduler asks its worker to stop it to
-- make room for `for_task_id`; `done_at` once it stopped and went back to the queue. A
-- request older than the task's latest assignment is void (the task was placed again).
CREATE TABLE preemptions (
    id            INTEGER PRIMARY KEY,
    task_id       INTEGER NOT NULL,
    job_id        INTEGER NOT NULL,
    worker_id     INTEGER NOT NULL,
    for_task_id   INTEGER NOT NULL,
    for_job_id    INTEGER NOT NULL,
    reason        TEXT NOT NULL CHECK (reason IN (
                      'priority',  -- preemptible work of a lower priority
                      'borrowed',  -- work over its project's nominal quota, for a project within its own
                      'idle'       -- its GPUs idle past its idle policy (for_task_id: itself)
                  )),
    asked_at      REAL NOT NULL,
    done_at       REAL
) STRICT;
CREATE INDEX preemptions_task ON preemptions (task_id, done_at);
CREATE INDEX preemptions_for ON preemptions (for_task_id) WHERE done_at IS NULL;
CREATE INDEX preemptions_worker ON preemptions (worker_id) WHERE done_at IS NULL;

-- What the idle check (scheduler/idle.py) did to a task's assignment: warned (a shell or SSH session was
-- open), notified, requeued or cancelled; each once per assignment (docs/workers.md "Idle GPUs").
CREATE TABLE idle_reclaims (
    id           INTEGER PRIMARY KEY,
    task_id      INTEGER NOT NULL,
    job_id       INTEGER NOT NULL,
    assigned_at  REAL NOT NULL,   -- the task's assignment it is about (a requeued task is judged afresh)
    action       TEXT NOT NULL CHECK (action IN ('warn', 'notify', 'requeue', 'cancel')),
    at           REAL NOT NULL
) STRICT;
CREATE INDEX idle_reclaims_task ON idle_reclaims (task_id, assigned_at);

-- Room held for a waiting gang while the preemption victims that make it stop: a row per
-- worker chosen for one of its ranks, written in the preemption round that asked for the
-- victims (preemption.py). Until `expires_at` (the preemption grace plus two lease TTLs after
-- it), other work on that worker (acquire_task, another gang's gang_workers) takes only room
-- beyond it: a slot and the rank's GPUs, CPUs and memory. Deleted when the job leaves the queue
-- (placed or cancelled: the trigger below); an expired row counts for nothing and goes at the
-- next preemption round.
CREATE TABLE gang_reservations (
    worker_id    INTEGER NOT NULL,
    job_id       INTEGER NOT NULL,
    gpus         INTEGER NOT NULL CHECK (gpus >= 0),   -- one rank's
    cpus         REAL NOT NULL CHECK (cpus >= 0),
    memory_mb    INTEGER NOT NULL CHECK (memory_mb >= 0),
    reserved_at  REAL NOT NULL,
    expires_at   REAL NOT NULL,
    PRIMARY KEY (worker_id, job_id)
) STRICT;
CREATE INDEX gang_reservations_job ON gang_reservations (job_id);

CREATE TRIGGER jobs_gang_reservations_end AFTER UPDATE OF state ON jobs
WHEN old.state = 'queued' AND new.state <> 'queued' AND new.gang = 1 BEGIN
    DELETE FROM gang_reservations WHERE job_id = new.id;
END;

-- ---------------------------------------------------------------------------------------
-- Reservations and backfill: job_runtime_model, task_expected_end, reservations.
-- ---------------------------------------------------------------------------------------

-- How long each task of a job that has not ended (queued, waiting or running) is expected to run, in
-- seconds, one row per job:
--   limit_s     its time limit (the spec's `timeout_seconds`: `submit --time`, `job update`), or NULL
--   runs        its user's latest ended runs (at most 20) of the same job name, or, for a job without a
--               name, of unnamed jobs with the same command: runs that ended on their own (succeeded,
--               failed, timed out; not cancelled, lost, preempted or requeued); the usage ledger
--   learned_s   the 90th percentile of those runs' durations (the shortest >= 90% of them), NULL with
--               fewer than 3; median_s their median (the lower middle one)
--   default_s   the documented default for a job with neither (`server start --default-runtime`, 3600)
--   limit_ratio the median of run time over time limit of the cluster's latest 200 ended runs (of jobs
--               that had one and still exist), NULL with fewer than 3: users overestimate their limits
--   expected_s  coalesce(limit_s, learned_s, default_s): what backfill and reservations judge by (a task
--               may run until its limit, so a reservation made from it is safe)
--   typical_s   what a start-time estimate should use: the median of its runs, never beyond the limit;
--               else the limit times limit_ratio; else the limit; else the default
--   source      'limit', 'history' or 'default': where expected_s came from
CREATE VIEW job_runtime_model AS
SELECT m.job_id, m.state, m.limit_s, m.runs, CASE WHEN m.runs >= 3 THEN m.p90_s END AS learned_s,
       CASE WHEN m.runs >= 3 THEN m.median_s END AS median_s, m.default_s, m.limit_ratio,
       coalesce(m.limit_s, CASE WHEN m.runs >= 3 THEN m.p90_s END, m.default_s) AS expected_s,
       CASE WHEN m.runs >= 3 THEN min(m.median_s, coalesce(m.limit_s, m.median_s))
            ELSE coalesce(m.limit_s * m.limit_ratio, m.limit_s, m.default_s) END AS typical_s,
       CASE WHEN m.limit_s IS NOT NULL THEN 'limit' WHEN m.runs >= 3 THEN 'history' ELSE 'default' END AS source
FROM (SELECT h.job_id, h.state, h.limit_s, h.default_s, h.limit_ratio, json_extract(h.history, '$[0]') AS runs,
             json_extract(h.history, '$[1]') AS p90_s, json_extract(h.history, '$[2]') AS median_s
      FROM (SELECT j.id AS job_id, j.state, json_extract(j.spec, '$.timeout_seconds') AS limit_s,
                   st.default_runtime_s AS default_s,
                   (SELECT CASE WHEN count(*) >= 3 THEN max(CASE WHEN r.pos = (r.n + 1) / 2 THEN r.ratio END) END
                    FROM (SELECT x.ratio, row_number() OVER (ORDER BY x.ratio) AS pos, count(*) OVER () AS n
                          FROM (SELECT (u.ended_at - u.started_at) / json_extract(o.spec, '$.timeout_seconds') AS ratio
                                FROM (SELECT * FROM usage ORDER BY ended_at DESC LIMIT 200) u
                                JOIN jobs o ON o.id = u.job_id
                                WHERE u.outcome IN ('succeeded', 'failed', 'timed_out')
                                  AND json_extract(o.spec, '$.timeout_seconds') > 0) x) r) AS limit_ratio,
                   (SELECT json_array(count(*), max(CASE WHEN r.pos = (r.n * 9 + 9) / 10 THEN r.run_s END),
                                      max(CASE WHEN r.pos = (r.n + 1) / 2 THEN r.run_s END))
                    FROM (SELECT x.run_s, row_number() OVER (ORDER BY x.run_s) AS pos, count(*) OVER () AS n
                          FROM (SELECT u.ended_at - u.started_at AS run_s FROM usage u
                                WHERE u.user_id = j.user_id AND u.job_name IS j.name
                                  AND u.outcome IN ('succeeded', 'failed', 'timed_out')
                                  AND (j.name IS NOT NULL
                                       OR (SELECT json_extract(o.spec, '$.command') FROM jobs o WHERE o.id = u.job_id)
                                          = json_extract(j.spec, '$.command'))
                                ORDER BY u.ended_at DESC LIMIT 20) x) r) AS history
            FROM jobs j CROSS JOIN scheduler_settings st
            WHERE j.state IN ('queued', 'running', 'waiting')) h) m;

-- When each task that holds room on a worker now (assigned or running; not one leased ahead) is
-- expected to end: from its start (its assignment until it started) plus its job's expected_s
-- (expected_end_at: what reservations and backfill judge by) or typical_s (typical_end_at: what a
-- start-time estimate uses). A task past its expected end is overrunning: it ends when it ends.
CREATE VIEW task_expected_end AS
SELECT t.id AS task_id, t.job_id, t.worker_id, t.state, coalesce(t.started_at, t.assigned_at) AS since,
       coalesce(t.started_at, t.assigned_at) + m.expected_s AS expected_end_at,
       coalesce(t.started_at, t.assigned_at) + m.typical_s AS typical_end_at, m.source
-- CROSS JOIN (schema 36): the active tasks first, then each one's job's model; a plain JOIN let SQLite read
-- the model of every queued job and look its tasks up (2 ms a plan at 8,000 queued instead of 0.07).
FROM tasks t CROSS JOIN job_runtime_model m ON m.job_id = t.job_id
WHERE t.state IN ('assigned', 'running') AND t.ahead = 0;

-- Service updates (schema 31): one row per `service update` of a service, the new revision's spec and
-- its rollout's state (scheduler/rollout.py, docs/services.md "Rolling updates"); jobs.revision is the
-- revision a service serves, tasks.revision the one a replica runs.
CREATE TABLE service_updates (
    job_id            INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    revision          INTEGER NOT NULL CHECK (revision >= 2),     -- the new revision
    from_revision     INTEGER NOT NULL CHECK (from_revision >= 1),
    spec              TEXT NOT NULL CHECK (json_valid(spec)),     -- the new revision's JobSpec, normalised
    changes           TEXT NOT NULL CHECK (json_valid(changes)),  -- what the update changed (image, env, command)
    state             TEXT NOT NULL CHECK (state IN (
                          'rolling',       -- new replicas replace old ones (or a canary waits for promote)
                          'rolling_back',  -- the old revision replaces the new one's replicas
                          'finished',      -- every replica runs the new revision
                          'rolled_back',   -- every replica runs the old revision again
                          'ended'          -- the service ended during the rollout
                      )),
    max_surge         INTEGER NOT NULL CHECK (max_surge >= 0),
    max_unavailable   INTEGER NOT NULL CHECK (max_unavailable >= 0),
    canary            INTEGER CHECK (canary IS NULL OR canary BETWEEN 1 AND 99),  -- percent of ingress requests
    ready_timeout_s   REAL NOT NULL CHECK (ready_timeout_s > 0),
    drain_s           REAL NOT NULL CHECK (drain_s >= 0),
    reason            TEXT,            -- why it rolled back
    created_at        REAL NOT NULL,
    promoted_at       REAL,
    finished_at       REAL,
    PRIMARY KEY (job_id, revision),
    CHECK ((state IN ('finished', 'rolled_back', 'ended')) = (finished_at IS NOT NULL))
) STRICT;
-- At most one rollout of a service at a time (a second `service update` is refused: update_in_progress).
CREATE UNIQUE INDEX service_updates_active ON service_updates (job_id) WHERE state IN ('rolling', 'rolling_back');

-- Reservations (EASY backfill, like Slurm's): room on a worker held from `start_at` for a waiting job
-- that fits no worker now, where and when it can start earliest (the running tasks' expected ends and
-- the reservations made before it), for the highest-ranked waiting jobs of each group of workers (upkeep's
-- plan_reservations rewrites them every tick: `planned_at`). A row per worker it will use (a gang's
-- ranks: several workers at once): `tasks` of its tasks there, their GPUs, CPUs and memory. Until then,
-- the claim gives a worker another queued task that would use the room only if that task is expected
-- to end (now + its expected_s) by `start_at`. `reason`: why it waits, as job status shows it. Deleted
-- in the transaction that makes the job unable to use it (it leaves the queue: placed, cancelled,
-- waiting; it is held), or the worker (it goes offline or away, it is cordoned), or when the job holds
-- room now instead (gang_reservations, below: the two never both hold room for one job).
CREATE TABLE reservations (
    job_id      INTEGER NOT NULL,
    worker_id   INTEGER NOT NULL,
    tasks       INTEGER NOT NULL CHECK (tasks >= 1),
    gpus        INTEGER NOT NULL CHECK (gpus >= 0),    -- of all its tasks there
    cpus        REAL NOT NULL CHECK (cpus >= 0),
    memory_mb   INTEGER NOT NULL CHECK (memory_mb >= 0),
    start_at    REAL NOT NULL,
    planned_at  REAL NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (job_id, worker_id)
) STRICT;
-- The claim asks for a worker's reservations.
CREATE INDEX reservations_worker ON reservations (worker_id, start_at);

CREATE TRIGGER jobs_reservations_end AFTER UPDATE OF state ON jobs
WHEN old.state = 'queued' AND new.state <> 'queued' BEGIN
    DELETE FROM reservations WHERE job_id = new.id;
END;
CREATE TRIGGER jobs_reservations_held AFTER UPDATE OF hold ON jobs WHEN new.hold = 1 BEGIN
    DELETE FROM reservations WHERE job_id = new.id;
END;
CREATE TRIGGER workers_reservations_gone AFTER UPDATE OF state ON workers WHEN new.state <> 'online' BEGIN
    DELETE FROM reservations WHERE worker_id = new.id;
END;
CREATE TRIGGER worker_cordons_reservations AFTER INSERT ON worker_cordons BEGIN
    DELETE FROM reservations WHERE worker_id = new.worker_id;
END;
CREATE TRIGGER gang_reservations_supersede AFTER INSERT ON gang_reservations BEGIN
    DELETE FROM reservations WHERE job_id = new.job_id;
END;

-- What each worker gains by each reservation's start, beyond its reservations (below 0: it loses): what
-- its active tasks expected to have ended by then free (task_expected_end), less what the reservations on
-- it that start by then hold (the reservation's own included). One row per reservation. Its room then is
-- its free room now (worker_load) plus the gain: the claim (claimable_tasks) gives a task that would still
-- run at a reservation's start only room within it.
CREATE VIEW reservation_room AS
SELECT r.worker_id, r.job_id, r.start_at,
       (SELECT count(*) FROM task_expected_end e
                       WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.tasks) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_slots,
       (SELECT total(j.gpus) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                      WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.gpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_gpus,
       (SELECT total(j.cpus) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                      WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.cpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_cpus,
       (SELECT total(j.memory_mb) FROM task_expected_end e JOIN jobs j ON j.id = e.job_id
                           WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
       - (SELECT total(x.memory_mb) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
       AS gain_memory_mb
FROM reservations r;

-- Start-time estimates: the latest forecast's answer for each waiting job it estimated
-- (scheduler/forecast.py: the placement rules replayed forward on a copy of this file, with each
-- task's typical run from job_runtime_model), rewritten whole after each forecast; the Job's
-- `estimated_start_at` is the same forecast's. A row of a job that started since is stale until the
-- next forecast: read it beside jobs.state IN ('queued', 'waiting').
CREATE TABLE estimates (
    job_id       INTEGER PRIMARY KEY,
    start_at     REAL,                -- when it is expected to start; NULL: it cannot be known (`reason`)
    reason       TEXT,                -- why start_at is NULL (held, after a job that has not ended, ...)
    workers      TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(workers)),  -- names it would start on
    forecast_at  REAL NOT NULL,       -- the forecast's time (the copy's `now`)
    CHECK ((start_at IS NULL) = (reason IS NOT NULL))
) STRICT;

-- ---------------------------------------------------------------------------------------
-- Quotas' use now: project_load, project_quota_use; as admission reads them: queue_group_quota,
-- user_running_jobs.
-- ---------------------------------------------------------------------------------------

-- GPUs each project's active tasks hold now (a fractional task its share: tasks.gpu_share), and its running jobs.
CREATE VIEW project_load AS
SELECT j.project_id, sum(j.gpus) + CASE WHEN max(t.gpu_share) > 0 THEN sum(t.gpu_share) ELSE 0 END AS gpus_in_use, count(DISTINCT j.id) AS running_jobs
FROM jobs j
JOIN tasks t ON t.job_id = j.id AND t.state IN ('assigned', 'running')
WHERE j.state = 'running'
GROUP BY j.project_id;

-- Each project's GPU quota and its use now: `borrowed` is what it holds beyond its nominal
-- quota (preemptible by a project within its own), `queued_tasks` what waits in task_queue.
CREATE VIEW project_quota_use AS
SELECT p.id AS project_id, p.name, p.gpu_quota AS nominal, p.gpu_borrow AS borrow, p.weight,
       coalesce(l.gpus_in_use, 0) AS gpus_in_use, coalesce(l.running_jobs, 0) AS running_jobs,
       CASE WHEN p.gpu_quota IS NULL THEN 0 ELSE max(coalesce(l.gpus_in_use, 0) - p.gpu_quota, 0) END AS borrowed,
       (SELECT coalesce(sum(g.queued), 0) FROM queue_groups g WHERE g.project_id = p.id) AS queued_tasks
FROM projects p
LEFT JOIN project_load l ON l.project_id = p.id;

-- Each group of queued work (queue_groups: shape, project, user) as admission judges it: its
-- shape's GPUs, its project's `borrow` and share for fair share (its weight, else its nominal
-- quota, else 1), and `nominal_left`: the GPUs of the project's nominal quota left once one more
-- task of the group runs (the quota, less the GPUs its running jobs' active tasks hold, less the
-- task's; below 0 it would borrow), NULL when no quota bounds it (none set, or a task without
-- GPUs). acquire_task admits a group at nominal_left >= 0, or up to `borrow` beyond while no
-- other project's group that the worker could take is within its own nominal quota. A fractional
-- task counts its `gpu_fraction` (schema 32; held, its tasks.gpu_share).
CREATE VIEW queue_group_quota AS
SELECT g.shape_id, g.project_id, g.user_id, s.gpus, p.gpu_borrow AS borrow,
       coalesce(p.weight, nullif(p.gpu_quota, 0), 1) AS share,
       CASE WHEN p.gpu_quota IS NULL OR (s.gpus = 0 AND s.gpu_fraction = 0) THEN NULL
            ELSE p.gpu_quota - s.gpus - s.gpu_fraction - (
           SELECT coalesce(sum(j.gpus), 0) + CASE WHEN max(t.gpu_share) > 0 THEN sum(t.gpu_share) ELSE 0 END
           FROM jobs j  -- project_load.gpus_in_use, of this project only
           -- (the redundant IN term seeks tasks_job_active by state, not a running array's every task)
           JOIN tasks t ON t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
                           AND t.state IN ('assigned', 'running')
           WHERE j.project_id = g.project_id AND j.state = 'running') END AS nominal_left
FROM queue_groups g
JOIN shapes s ON s.id = g.shape_id
JOIN projects p ON p.id = g.project_id;

-- Each user's running-jobs limit (`user set --max-running-jobs`) and the jobs counted against
-- it now: a running job counts one, a running array each of its active elements (as Slurm's
-- MaxJobs counts array tasks). `at_limit`: 1 when one more job would pass the limit. Admission
-- reads it (acquire_task, next_gang_job, preemption_candidates, job_quota_reason): a task that
-- adds a job (not a running job's queued replica) waits while its user is at the limit.
CREATE VIEW user_running_jobs AS
SELECT c.*, CASE WHEN c.max_running_jobs IS NULL THEN 0 ELSE c.running_jobs >= c.max_running_jobs END AS at_limit
FROM (SELECT u.id AS user_id, u.name, u.max_running_jobs,
             (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
                  SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                                 AND t.state IN ('assigned', 'running')) END)
              FROM jobs r WHERE r.user_id = u.id AND r.state = 'running') AS running_jobs
      FROM users u) c;

-- Fair share, written once: each user's usage in each project decayed by the half-life to the
-- claim's time (claim_clock), plus `running`; and each project's, the sum of its users' over the
-- project's share (its weight, else its GPU quota, else 1; 0 with no usage). The claims
-- (acquire_one, acquire_task) and gang placement (next_gang_job) rank work of the same priority
-- by the project's, then the user's (none, no usage row, first), lowest first.
CREATE VIEW user_fair_share AS
SELECT fs.project_id, fs.user_id,
       fs.usage * pow(0.5, (c.now - fs.updated_at) / st.fairshare_half_life_s) + fs.running AS usage
FROM fairshare fs, claim_clock c, scheduler_settings st;

CREATE VIEW project_fair_share AS
SELECT p.id AS project_id,
       (SELECT coalesce(sum(u.usage), 0) FROM user_fair_share u WHERE u.project_id = p.id)
       / coalesce(p.weight, nullif(p.gpu_quota, 0), 1) AS usage
FROM projects p;

-- ---------------------------------------------------------------------------------------
-- The claim (queries/placement.sql: acquire_one, acquire_task): claimable_groups, claimable_tasks
-- (the ranking, written once), claimable_batch.
-- ---------------------------------------------------------------------------------------

-- Which groups of queued work (queue_groups: shape, project, user; single tasks, not gangs) each worker
-- may take a task of now, as admission judges them: the shape fits the worker now (shape_worker_fit),
-- beyond the room held on it for a waiting gang (gang_reservations not expired at the claim's time,
-- claim_clock); the project is within its nominal GPU quota
-- (queue_group_quota.nominal_left >= 0 or NULL), or would borrow up to `borrow` beyond it: `blocked`
-- while another project's group the worker may take is within its own (`contested`). `user_left`: the
-- jobs the user may still add (user_running_jobs; NULL without a limit). `by_index`: shape_worker_fit's.
-- project_usage and user_usage: fair share (project_fair_share, user_fair_share) at the claim's time;
-- room_*: the worker's free slots, GPUs, CPUs and memory less the room held for a gang; `shared`: a share of one
-- GPU (shape_worker_fit.gpu_share > 0; schema 32).
CREATE VIEW claimable_groups AS
SELECT c.*, coalesce(c.nominal_left < 0 AND c.contested, 0) AS blocked
FROM (SELECT a.*, coalesce(min(CASE WHEN a.nominal_left >= 0 THEN a.project_id END) OVER w <> a.project_id
                           OR max(CASE WHEN a.nominal_left >= 0 THEN a.project_id END) OVER w <> a.project_id, 0)
                  AS contested
      FROM (SELECT f.worker_id, q.shape_id, q.project_id, q.user_id, q.gpus, s.cpus, s.memory_mb, q.borrow,
                   q.nominal_left, f.by_index, f.gpu_share > 0 AS shared,
                   f.free_slots - (SELECT count(*) FROM gang_reservations r
                                   WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_slots,
                   f.free_gpus - (SELECT total(r.gpus) FROM gang_reservations r
                                  WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_gpus,
                   f.free_cpus - (SELECT total(r.cpus) FROM gang_reservations r
                                  WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_cpus,
                   f.free_memory_mb - (SELECT total(r.memory_mb) FROM gang_reservations r
                                       WHERE r.worker_id = f.worker_id AND r.expires_at > k.now) AS room_memory_mb,
                   (SELECT u.usage FROM project_fair_share u WHERE u.project_id = q.project_id) AS project_usage,
                   (SELECT u.usage FROM user_fair_share u WHERE u.project_id = q.project_id AND u.user_id = q.user_id)
                   AS user_usage,
                   (SELECT u.max_running_jobs - u.running_jobs FROM user_running_jobs u WHERE u.user_id = q.user_id)
                   AS user_left
            FROM shapes s INDEXED BY shapes_queued
            JOIN shape_worker_fit f ON f.shape_id = s.id
            CROSS JOIN queue_group_quota q ON q.shape_id = s.id
            CROSS JOIN claim_clock k
            WHERE s.queued > 0 AND s.gang = 0 AND f.fits_now  -- and, while a gang holds room on it, room beyond
              AND (NOT EXISTS (SELECT 1 FROM gang_reservations r WHERE r.worker_id = f.worker_id AND r.expires_at > k.now)
                   OR (room_slots >= 1 AND room_gpus >= s.gpus AND room_cpus >= s.cpus
                       AND room_memory_mb >= s.memory_mb))) a
      WINDOW w AS (PARTITION BY a.worker_id)) c
WHERE c.nominal_left IS NULL OR c.nominal_left >= 0 OR c.nominal_left + c.borrow >= 0;  -- admitted, or blocked

-- The tasks each worker may claim, and their rank: `pos`, the ranking written once: priority with its age
-- boost (upkeep's age_queued_tasks) highest first, then fair share, the project's then the user's,
-- lowest first, then first come. Each claimable group offers its best claim_clock.depth tasks (the
-- claim sets it: 1 for one task, one more than it may take for several) of jobs the worker holds none
-- of (an array's elements may share a worker, a job's other replicas may not), down task_queue_shape,
-- so queued tasks it cannot take cost nothing. `adds_job`: it counts against the user's running-jobs
-- limit (not a running job's queued replica; an array's element does). `eligible`: its group is not
-- blocked and it adds no job while its user is at the limit; the first eligible task is the one-task
-- claim's choice (acquire_one). Held tasks (a waiting job's, an array's past its %N cap) are not in
-- task_queue. EASY backfill: on a worker holding a reservation of another job (`reserved`), a task that
-- would use room the reservation needs at its start (its room now plus reservation_room's gain) is not
-- offered unless it is expected to end by then (the claim's now plus its job's expected_s) and its job
-- may be backfilled (spec `backfill`, default true); a group offers its best tasks that are, among its
-- best claim_clock.depth + 32 while any reservation exists (claimable_batch is sure of a reserved worker's
-- first task only). Each reservation's gain (reservation_room's, read from `ends`: each active task's
-- expected end, from job_runtime_model, read once, not once for each reservation and resource) is read once
-- a claim (`rooms`, materialized), not once for each task it judges, and only the claim's worker's
-- (claim_clock.worker_id; every worker's when NULL) (schema 29).
CREATE VIEW claimable_tasks AS
WITH
ends AS MATERIALIZED (  -- task_expected_end of the claim's worker's tasks, if it holds a reservation: once a claim
    SELECT e.worker_id, e.expected_end_at, j.gpus, j.cpus, j.memory_mb
    FROM task_expected_end e JOIN jobs j ON j.id = e.job_id, claim_clock k
    WHERE e.worker_id IN (SELECT x.worker_id FROM reservations x WHERE k.worker_id IS NULL OR x.worker_id = k.worker_id)
),
rooms AS MATERIALIZED (  -- reservation_room of the claim's worker, from `ends`: once a claim, not once a task
    SELECT r.worker_id, r.job_id, r.start_at,
           (SELECT count(*) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.tasks) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_slots,
           (SELECT total(e.gpus) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.gpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_gpus,
           (SELECT total(e.cpus) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.cpus) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_cpus,
           (SELECT total(e.memory_mb) FROM ends e WHERE e.worker_id = r.worker_id AND e.expected_end_at <= r.start_at)
           - (SELECT total(x.memory_mb) FROM reservations x WHERE x.worker_id = r.worker_id AND x.start_at <= r.start_at)
           AS gain_memory_mb
    FROM reservations r, claim_clock k
    WHERE k.worker_id IS NULL OR r.worker_id = k.worker_id
)
SELECT o.*, NOT o.blocked AND NOT (o.adds_job AND coalesce(o.user_left <= 0, 0)) AS eligible
FROM (SELECT g.worker_id, g.shape_id, g.project_id, g.user_id, g.gpus, g.cpus, g.memory_mb, g.borrow, g.nominal_left,
             g.room_slots, g.room_gpus, g.room_cpus, g.room_memory_mb, g.by_index, g.user_left, g.contested,
             g.blocked, g.shared, h.task_id, h.job_id, NOT (j.state = 'running' AND j.array_size IS NULL) AS adds_job,
             j.array_size IS NULL AS single, g.reserved,
             row_number() OVER (PARTITION BY g.worker_id
                                ORDER BY h.priority + h.aged DESC, g.project_usage, g.user_usage, h.task_id) AS pos
      FROM (SELECT c.*, EXISTS (SELECT 1 FROM reservations x WHERE x.worker_id = c.worker_id) AS reserved
            FROM claimable_groups c) g
      -- CROSS JOIN: the groups first, then each one's best by task_id (schema 36). A plain JOIN let SQLite,
      -- without statistics (the state file has none), scan every queued task and test it against the list:
      -- 14 ms a claim at 8,000 queued instead of 0.7 (docs/benchmarks/issue-41.md, "The writer's work per cycle").
      CROSS JOIN task_queue h ON h.task_id IN (  -- the group's best, of jobs the worker holds none of (or arrays)
          SELECT a.task_id FROM (
              SELECT b.task_id, b.job_id, b.priority + b.aged AS rank_priority FROM task_queue b
              WHERE b.shape_id = g.shape_id AND b.project_id = g.project_id AND b.user_id = g.user_id
                AND ((SELECT x.array_size FROM jobs x WHERE x.id = b.job_id) IS NOT NULL
                     OR NOT EXISTS (SELECT 1 FROM tasks o  -- +o.job_id: by the worker's few tasks, not the job's
                                    WHERE o.worker_id = g.worker_id AND +o.job_id = b.job_id
                                      AND o.state IN ('assigned', 'running')))
              ORDER BY b.priority + b.aged DESC, b.task_id
              LIMIT (SELECT c.depth + 32 * EXISTS (SELECT 1 FROM reservations) FROM claim_clock c)) a
          WHERE NOT g.reserved OR NOT EXISTS (  -- room a reservation needs at its start, still held then
              SELECT 1 FROM rooms r, jobs rj, claim_clock k
              WHERE r.worker_id = g.worker_id AND r.job_id <> a.job_id AND rj.id = a.job_id
                AND (g.room_slots + r.gain_slots < 1 OR g.room_gpus + r.gain_gpus < g.gpus
                     OR g.room_cpus + r.gain_cpus < g.cpus OR g.room_memory_mb + r.gain_memory_mb < g.memory_mb)
                AND (NOT coalesce(json_extract(rj.spec, '$.backfill'), 1)
                     OR k.now + (SELECT m.expected_s FROM job_runtime_model m WHERE m.job_id = a.job_id) > r.start_at))
          ORDER BY a.rank_priority DESC, a.task_id LIMIT (SELECT c.depth FROM claim_clock c))
      JOIN jobs j ON j.id = h.job_id) o;

-- What one claim statement of several tasks (acquire_task) may take for each worker, `k` its place: the
-- tasks of claimable_tasks down the ranking, each judged by the room, quota use and running jobs the
-- claims before it leave, as as many one-task claims in a row would judge it. A candidate is neither
-- `replica` (a job's other replica below its first: the worker holds the job once that is claimed),
-- `dead` (its group's best task from here on adds a job while the user is at the limit) nor blocked.
-- Running sums down the ranking stand for the claims before each row: the worker's slots, GPUs, CPUs
-- and memory (room_*), the project's GPUs against `nominal_left` (and `borrow`), the user's added jobs
-- against `user_left`. `sure`: the first candidate (the one-task claim's choice), then those before the
-- first row the sums cannot be sure of (`stop_here`): a candidate whose sums no longer fit, one whose
-- GPU indices are picked by index (only as the first: its room is no sum), any but the first on a worker
-- holding a reservation (`reserved`: the room each claim leaves beyond it is no running sum either), a
-- blocked group's row (it may
-- become the better choice once another project leaves its nominal quota); and none after a group's
-- last row read (`stop_after`: its rest was not), nor after a share of a GPU (`shared`, schema 32: it may take a
-- whole GPU, which no running sum counts). Conservative, never more: placement.acquire_many
-- claims again when fewer came back than asked. An array's %N cap needs no sum (its held elements are
-- not in task_queue). Each level's windows share one partition, so that a `worker_id = ?` reaches the
-- views below.
CREATE VIEW claimable_batch AS
WITH
flagged AS (  -- dead, unread_after: by group
    SELECT e.*, max(e.adds_job AND coalesce(e.user_left <= 0, 0)) OVER g AS dead,
           row_number() OVER g = (SELECT c.depth FROM claim_clock c) AS unread_after
    FROM claimable_tasks e
    WINDOW g AS (PARTITION BY e.worker_id, e.shape_id, e.project_id, e.user_id ORDER BY e.pos)
),
candidates AS (  -- replica: by job
    SELECT r.*, NOT r.replica AND NOT r.dead AND NOT r.blocked AS candidate
    FROM (SELECT d.*, d.single AND row_number() OVER (PARTITION BY d.worker_id, d.job_id ORDER BY d.pos) > 1 AS replica
          FROM flagged d) r
),
sums AS (  -- what the candidates up to each row (itself included) ask, in claim order
    SELECT c.*, sum(c.candidate) OVER w AS k, sum(c.candidate * c.gpus) OVER w AS sum_gpus,
           sum(c.candidate * c.cpus) OVER w AS sum_cpus, sum(c.candidate * c.memory_mb) OVER w AS sum_memory_mb
    FROM candidates c
    WINDOW w AS (PARTITION BY c.worker_id ORDER BY c.pos ROWS UNBOUNDED PRECEDING)
),
project_sums AS (  -- the project's GPUs claimed before the row
    SELECT s.*, coalesce(sum(s.candidate * s.gpus) OVER (PARTITION BY s.worker_id, s.project_id ORDER BY s.pos
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                AS project_gpus_before
    FROM sums s
),
user_sums AS (  -- the user's jobs added before the row
    SELECT p.*, coalesce(sum(p.candidate * p.adds_job) OVER (PARTITION BY p.worker_id, p.user_id ORDER BY p.pos
                                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                AS jobs_before
    FROM project_sums p
),
stops AS (  -- stop_here: a misfit, or a blocked group's row; stop_after: a group's last row read
    SELECT u.worker_id, u.task_id, u.pos, u.k, u.candidate,
           (u.blocked AND NOT u.dead) OR (u.candidate AND (
               u.k > u.room_slots OR u.sum_gpus > u.room_gpus OR u.sum_cpus > u.room_cpus
               OR u.sum_memory_mb > u.room_memory_mb OR (u.k > 1 AND (u.by_index OR u.reserved))
               OR CASE WHEN u.nominal_left IS NULL OR u.nominal_left - u.project_gpus_before >= 0 THEN 0
                       WHEN u.contested THEN 1
                       ELSE u.nominal_left - u.project_gpus_before + u.borrow < 0 END
               OR (u.adds_job AND coalesce(u.user_left - u.jobs_before <= 0, 0)))) AS stop_here,
           (u.unread_after AND NOT u.dead) OR (u.candidate AND u.shared) AS stop_after
    FROM user_sums u
)
SELECT b.worker_id, b.task_id, b.k, b.candidate AND (b.k = 1 OR (b.stops_before = 0 AND NOT b.stop_here)) AS sure
FROM (SELECT t.*, coalesce(sum(t.stop_here OR t.stop_after)
                           OVER (PARTITION BY t.worker_id ORDER BY t.pos ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                           0) AS stops_before
      FROM stops t) b;
