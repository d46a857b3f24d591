-- Version 31: service revisions and rolling updates (issue 39, docs/services.md "Rolling updates").
-- jobs.revision: the revision the service serves (its `spec`); tasks.revision: the revision a replica runs.
-- service_updates: one row per `service update`, the new revision's spec and the rollout's state, which
-- upkeep's `rollouts` step drives (scheduler/rollout.py); a row stays as the service's history.
ALTER TABLE jobs ADD COLUMN revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1);
ALTER TABLE tasks ADD COLUMN revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1);

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
