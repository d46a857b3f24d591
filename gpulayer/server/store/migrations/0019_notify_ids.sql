-- Version 19: event seqs, webhook ids and alert ids are never given out again (AUTOINCREMENT). Every
-- `webhook-id` a webhook sends is msg_gl<webhook>e<event>, and receivers drop an id they have seen: a
-- new webhook given a removed one's id, or an event given a pruned one's seq (SQLite's next rowid is the
-- highest + 1, so pruning the newest events gave their seqs out again, behind webhooks' cursors), would
-- repeat ids. The three tables are rebuilt with their rows, ids and seqs; each one's sequence starts past
-- the highest id the file still names anywhere (a removed webhook is named by its events, an alert by its
-- events and mailboxes, a pruned event by webhooks' cursors and deliveries), so none is given again.
ALTER TABLE events RENAME TO events_v18;
DROP INDEX events_job;
DROP INDEX events_kind_at;
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
INSERT INTO events (seq, at, kind, job_id, task_id, worker_id, data, actor)
SELECT seq, at, kind, job_id, task_id, worker_id, data, actor FROM events_v18;
DROP TABLE events_v18;
CREATE INDEX events_job ON events (job_id, seq) WHERE job_id IS NOT NULL;
CREATE INDEX events_kind_at ON events (kind, at);

ALTER TABLE webhooks RENAME TO webhooks_v18;
DROP INDEX webhooks_job;
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
    created_at  REAL NOT NULL,
    CHECK ((url IS NULL) <> (email IS NULL)),
    CHECK (scope <> 'project' OR project_id IS NOT NULL),
    CHECK (scope <> 'job' OR job_id IS NOT NULL),
    CHECK (scope <> 'alert' OR alert_id IS NOT NULL)
) STRICT;
INSERT INTO webhooks (id, url, email, events, format, scope, project_id, job_id, alert_id, user_id, secret, cursor,
                      created_at)
SELECT id, url, email, events, format, scope, project_id, job_id, alert_id, user_id, secret, cursor, created_at
FROM webhooks_v18;
DROP TABLE webhooks_v18;
CREATE INDEX webhooks_job ON webhooks (job_id) WHERE job_id IS NOT NULL;

ALTER TABLE alerts RENAME TO alerts_v18;
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
INSERT INTO alerts (id, name, sql, every_s, webhook_id, user_id, seen, next_run_at, last_run_at, last_error, fired,
                    created_at)
SELECT id, name, sql, every_s, webhook_id, user_id, seen, next_run_at, last_run_at, last_error, fired, created_at
FROM alerts_v18;
DROP TABLE alerts_v18;

DELETE FROM sqlite_sequence WHERE name IN ('events', 'webhooks', 'alerts');
INSERT INTO sqlite_sequence (name, seq)
SELECT 'events', max(seq) FROM (
    SELECT max(seq) AS seq FROM events
    UNION ALL SELECT max(cursor) FROM webhooks
    UNION ALL SELECT max(event_seq) FROM webhook_deliveries)
HAVING max(seq) IS NOT NULL;
INSERT INTO sqlite_sequence (name, seq)
SELECT 'webhooks', max(id) FROM (
    SELECT max(id) AS id FROM webhooks
    UNION ALL SELECT max(webhook_id) FROM webhook_deliveries
    UNION ALL SELECT max(webhook_id) FROM alerts
    UNION ALL SELECT max(json_extract(data, '$.webhook_id')) FROM events
              WHERE kind IN ('webhook_added', 'webhook_removed', 'alert_added', 'alert_fired'))
HAVING max(id) IS NOT NULL;
INSERT INTO sqlite_sequence (name, seq)
SELECT 'alerts', max(id) FROM (
    SELECT max(id) AS id FROM alerts
    UNION ALL SELECT max(alert_id) FROM webhooks
    UNION ALL SELECT max(json_extract(data, '$.alert_id')) FROM events
              WHERE kind IN ('alert_added', 'alert_fired', 'alert_removed'))
HAVING max(id) IS NOT NULL;
