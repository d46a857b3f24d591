-- Version 15: notifications (issue 28): webhooks as an outbox over events, their deliveries, alerts.
-- Notifications (issue 28, docs/notifications.md): who is told of what. A webhook is an outbox over
-- `events`: `cursor` is the last event seq it has handled (delivered, given up on, or not its own),
-- advanced only in a write after the receiver's 2xx, so a restart (or SIGKILL) resumes there. A row
-- with `email` instead of `url` is a mailbox (`submit --mail-user`, `alert add --email`). `scope`
-- says whose events: all (admins), the adder's own jobs (user), a project's, one job's, or one
-- alert's (its `alert.fired` events only). `secret` is the `whsec_` signing secret, sealed like a
-- secret's value (security/secretbox.py).
CREATE TABLE webhooks (
    id          INTEGER PRIMARY KEY,
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
    created_at  REAL NOT NULL,
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

-- Alerts: a read-only query run every `every_s` (admins'); it fires (an `alert_fired` event,
-- delivered to `webhook_id`) when it returns rows it did not return last time. `seen`: the digests
-- of the rows it returned last time.
CREATE TABLE alerts (
    id           INTEGER PRIMARY KEY,
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
