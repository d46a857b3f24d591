-- Notifications (gpulayer/server/notify/, docs/notifications.md): webhooks, their deliveries, alerts.

-- name: insert_webhook --
-- A webhook or mailbox; its cursor starts at :cursor (events after it are its to deliver).
INSERT INTO webhooks (url, email, events, format, scope, project_id, job_id, alert_id, user_id, secret, cursor,
                      created_at)
VALUES (:url, :email, :events, :format, :scope, :project_id, :job_id, :alert_id, :user_id, :secret, :cursor, :now)
RETURNING id;

-- name: last_event_seq --
-- The newest event's seq (0 for none): a new webhook delivers what comes after it.
SELECT coalesce(max(seq), 0) AS seq FROM events;

-- name: job_first_event --
-- Where a job-scoped webhook starts: just before the job's first event (its submit), so one added right
-- after submit (`submit --mail-type`) misses nothing.
SELECT coalesce(min(seq) - 1, (SELECT coalesce(max(seq), 0) FROM events)) AS seq FROM events WHERE job_id = :job_id;

-- name: webhook_by_id --
-- One webhook with its project's and job's names, for its owner or an admin.
SELECT w.id, w.url, w.email, w.events, w.format, w.scope, w.job_id, p.name AS project, u.name AS owner,
       w.user_id, w.alert_id, w.cursor, w.created_at, w.disabled, w.secret
FROM webhooks w LEFT JOIN projects p ON p.id = w.project_id LEFT JOIN users u ON u.id = w.user_id
WHERE w.id = :id;

-- name: list_webhooks --
-- Webhooks by id after :after: all of them (:user_id NULL, an admin) or one user's; with their last
-- delivery's status and the count of deliveries still retrying.
SELECT w.id, w.url, w.email, w.events, w.format, w.scope, w.job_id, p.name AS project, u.name AS owner,
       w.alert_id, w.cursor, w.created_at, w.disabled,
       (SELECT count(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.status = 'retrying') AS retrying,
       (SELECT count(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.status = 'failed') AS failed,
       (SELECT count(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.status = 'delivered') AS delivered
FROM webhooks w LEFT JOIN projects p ON p.id = w.project_id LEFT JOIN users u ON u.id = w.user_id
WHERE w.id > :after AND (:user_id IS NULL OR w.user_id = :user_id)
ORDER BY w.id LIMIT :limit;

-- name: delete_webhook --
-- Remove a webhook and what its deliveries left.
DELETE FROM webhooks WHERE id = :id RETURNING id;

-- name: delete_webhook_deliveries --
DELETE FROM webhook_deliveries WHERE webhook_id = :id;

-- name: webhook_alerts --
-- The alerts that deliver to a webhook (it cannot be removed while one does).
SELECT name FROM alerts WHERE webhook_id = :id ORDER BY name;

-- name: due_webhooks --
-- At most :limit webhooks, not disabled, with events after their cursor (up to :upto), none of :inflight (a
-- JSON list of ids with a try under way) and none waiting out a retry's backoff, furthest behind first; with
-- the delivery being retried, if any. At most :per_owner of one owner's, counting those it has in flight
-- (:busy, {user_id: tries}): one owner's slow receivers never take every delivery thread. With what its
-- owner may read now, which the outbox checks each event against (outbox.may_read, teams.level's rules):
-- whether the owner is an admin, is gone (removed: the webhook is disabled), and its role in each project
-- ({project_id: role}).
WITH due AS (
    SELECT w.id, w.url, w.email, w.events, w.format, w.scope, w.project_id, w.job_id, w.alert_id, w.user_id,
           w.secret, w.cursor, d.event_seq AS retry_seq, d.attempts, d.first_try_at, d.next_try_at,
           u.name AS owner, coalesce(u.admin, 0) AS owner_admin, (u.id IS NULL OR u.removed_at IS NOT NULL) AS owner_gone,
           row_number() OVER (PARTITION BY w.user_id ORDER BY w.cursor, w.id) AS nth
    FROM webhooks w
    LEFT JOIN webhook_deliveries d ON d.webhook_id = w.id AND d.status = 'retrying'
    LEFT JOIN users u ON u.id = w.user_id
    WHERE w.cursor < :upto AND w.disabled IS NULL AND w.id NOT IN (SELECT value FROM json_each(:inflight))
      AND (d.next_try_at IS NULL OR d.next_try_at <= :now))
SELECT due.*, (SELECT json_group_object(m.project_id, m.role) FROM memberships m WHERE m.user_id = due.user_id) AS owner_roles
FROM due
WHERE nth + coalesce((SELECT b.value FROM json_each(:busy) b WHERE b.key = CAST(due.user_id AS TEXT)), 0) <= :per_owner
ORDER BY cursor, id LIMIT :limit;

-- name: disable_webhook --
-- A webhook whose owner is gone delivers no more: why, and its delivery being retried given up.
UPDATE webhooks SET disabled = :reason WHERE id = :id AND disabled IS NULL RETURNING id, job_id;

-- name: give_up_passed --
-- A retried delivery the cursor passed (its owner may no longer read the event, or the webhook was
-- disabled) is failed, not left retrying.
UPDATE webhook_deliveries SET status = 'failed', next_try_at = NULL, last_error = :error
WHERE webhook_id = :id AND status = 'retrying' AND event_seq <= :seq;

-- name: events_after --
-- The events of :kinds after :cursor up to :upto, oldest first (one job's when :job_id is given): the
-- outbox matches each webhook's scope in memory, so one read serves every webhook at that cursor. With
-- each: its job's name, project (and its visibility) and owner, whether a task_started is its job's first,
-- and for an alert_fired whether the alert's adder is an admin now (its rows are the whole file's). A
-- webhook's cursor passes what it does not want, so each look scans only the events since the last.
SELECT e.seq, e.at, e.kind, e.job_id, e.task_id, e.worker_id, e.data, e.actor, j.name AS job_name,
       j.project_id, j.user_id, p.name AS project, p.visibility, u.name AS owner, wk.name AS worker,
       (e.kind = 'task_started' AND NOT EXISTS (
           SELECT 1 FROM events f WHERE f.job_id = e.job_id AND f.kind = 'task_started' AND f.seq < e.seq))
           AS first_start,
       (e.kind = 'alert_fired' AND EXISTS (
           SELECT 1 FROM alerts a JOIN users au ON au.id = a.user_id
           WHERE a.id = json_extract(e.data, '$.alert_id') AND au.admin = 1 AND au.removed_at IS NULL))
           AS alert_admin
FROM events e
LEFT JOIN jobs j ON j.id = e.job_id
LEFT JOIN projects p ON p.id = j.project_id
LEFT JOIN users u ON u.id = j.user_id
LEFT JOIN workers wk ON wk.id = e.worker_id
WHERE e.seq > :cursor AND e.seq <= :upto AND e.kind IN (SELECT value FROM json_each(:kinds))
  AND (:job_id IS NULL OR e.job_id = :job_id)
ORDER BY e.seq LIMIT :limit;

-- name: advance_webhook --
-- The webhook handled every event up to :seq (never moves back).
UPDATE webhooks SET cursor = max(cursor, :seq) WHERE id = :id;

-- name: delivery_done --
-- A delivery's outcome: delivered (2xx) or failed (given up), with its try count and last error.
INSERT INTO webhook_deliveries (webhook_id, event_seq, event, status, attempts, first_try_at, last_try_at,
                                next_try_at, http_status, last_error)
SELECT :id, :seq, :event, :status, :attempts, :first_try_at, :now, :next_try_at, :http_status, :error
WHERE EXISTS (SELECT 1 FROM webhooks WHERE id = :id)
ON CONFLICT (webhook_id, event_seq) DO UPDATE SET
    status = excluded.status, attempts = excluded.attempts, last_try_at = excluded.last_try_at,
    next_try_at = excluded.next_try_at, http_status = excluded.http_status, last_error = excluded.last_error;

-- name: prune_deliveries --
-- Delivered and failed rows older than :before, a bounded batch.
DELETE FROM webhook_deliveries WHERE rowid IN (
    SELECT rowid FROM webhook_deliveries WHERE status <> 'retrying' AND last_try_at < :before LIMIT 10000);

-- name: insert_alert --
INSERT INTO alerts (name, sql, every_s, webhook_id, user_id, next_run_at, created_at)
VALUES (:name, :sql, :every_s, :webhook_id, :user_id, :now, :now)
RETURNING id;

-- name: alert_by_name --
SELECT id, name, webhook_id FROM alerts WHERE name = :name;

-- name: alert_email_webhook --
-- The mailbox an alert added with --email made (removed with it).
UPDATE webhooks SET alert_id = :alert_id WHERE id = :id;

-- name: delete_alert --
DELETE FROM alerts WHERE id = :id;

-- name: delete_alert_webhooks --
-- The mailboxes of an alert (`alert add --email`), and their deliveries.
DELETE FROM webhooks WHERE scope = 'alert' AND alert_id = :alert_id RETURNING id;

-- name: list_alerts --
SELECT a.id, a.name, a.sql, a.every_s, a.webhook_id, w.url, w.email, u.name AS owner, a.next_run_at,
       a.last_run_at, a.last_error, a.fired, a.created_at
FROM alerts a LEFT JOIN webhooks w ON w.id = a.webhook_id LEFT JOIN users u ON u.id = a.user_id
WHERE a.id > :after ORDER BY a.id LIMIT :limit;

-- name: due_alerts --
SELECT id, name, sql, every_s, webhook_id, seen FROM alerts WHERE next_run_at <= :now ORDER BY next_run_at;

-- name: alert_ran --
-- An alert's run: the rows it saw now, when it runs next, and its error (NULL when it ran).
UPDATE alerts SET seen = :seen, next_run_at = :next_run_at, last_run_at = :now, last_error = :error,
                  fired = fired + :fired
WHERE id = :id RETURNING id;
