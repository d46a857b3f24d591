-- Version 35: a job may require GPUs joined by NVLink (issue 40; docs/workers.md, "Topology"): jobs.gpu_link
-- ('nvlink', NULL for the default: preferred, not required) waits for a worker with as many free GPUs of one
-- NVLink set, which workers.gpu_nvlink names for each GPU (from its gpu_topology at register). shapes is made
-- again with gpu_link in its key, and task_queue with it (its foreign key names shapes), as 0032 did: their
-- rows and ids are kept; the views and triggers that read them go first and come back. shape_worker_fit
-- counts the NVLink set for such a shape; a batch claim takes one only first (by_index).
DROP VIEW claimable_batch;
DROP VIEW claimable_tasks;
DROP VIEW claimable_groups;
DROP VIEW queue_group_quota;
DROP VIEW project_quota_use;
DROP VIEW project_load;
DROP VIEW job_worker_fit;
DROP VIEW shape_worker_fit;
DROP VIEW job_shape;
DROP VIEW worker_load;
DROP TRIGGER jobs_shape;
DROP TRIGGER task_queue_count_in;
DROP TRIGGER task_queue_count_out;
DROP TRIGGER task_queue_group_in;
DROP TRIGGER task_queue_group_out;
DROP TRIGGER tasks_queued_insert;
DROP TRIGGER tasks_queued_again;
DROP TRIGGER tasks_dequeued;
DROP TRIGGER tasks_queued_delete;
DROP TRIGGER tasks_run_ended;
ALTER TABLE workers ADD COLUMN gpu_nvlink TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(gpu_nvlink));
ALTER TABLE jobs ADD COLUMN gpu_link TEXT CHECK (gpu_link IS NULL OR gpu_link = 'nvlink');
CREATE TABLE shapes_v34 AS SELECT * FROM shapes;
CREATE TABLE task_queue_v34 AS SELECT * FROM task_queue;
DROP TABLE task_queue;
DROP TABLE shapes;
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
INSERT INTO shapes (id, gang, gpus, gpu_fraction, gpu_memory_mb, cpus, memory_mb, accelerator, labels, secrets, queued)
SELECT id, gang, gpus, gpu_fraction, gpu_memory_mb, cpus, memory_mb, accelerator, labels, secrets, queued FROM shapes_v34;
CREATE TABLE task_queue (
    task_id   INTEGER PRIMARY KEY REFERENCES tasks (id),
    shape_id  INTEGER NOT NULL REFERENCES shapes (id),
    job_id    INTEGER NOT NULL,
    priority  INTEGER NOT NULL                      -- the task's (set at insert, never changed)
    , project_id INTEGER NOT NULL DEFAULT 1, user_id INTEGER NOT NULL DEFAULT 1
    , aged INTEGER NOT NULL DEFAULT 0 CHECK (aged >= 0), since REAL NOT NULL DEFAULT 0
) STRICT;
INSERT INTO task_queue (task_id, shape_id, job_id, priority, project_id, user_id, aged, since)
SELECT task_id, shape_id, job_id, priority, project_id, user_id, aged, since FROM task_queue_v34;
DROP TABLE task_queue_v34;
DROP TABLE shapes_v34;
CREATE INDEX shapes_queued ON shapes (id) WHERE queued > 0;
CREATE INDEX task_queue_shape ON task_queue (shape_id, project_id, user_id, priority + aged DESC, task_id);
CREATE INDEX task_queue_aging ON task_queue (aged, since);
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
CREATE VIEW job_shape AS
SELECT j.id AS job_id, j.state AS job_state, s.id AS shape_id
FROM jobs j
JOIN shapes s ON s.gang = j.gang AND s.gpus = j.gpus AND s.cpus = j.cpus AND s.memory_mb = j.memory_mb
             AND s.gpu_fraction = coalesce(j.gpu_fraction, 0) AND s.gpu_memory_mb = coalesce(j.gpu_memory_mb, 0)
             AND s.gpu_link = coalesce(j.gpu_link, '')
             AND s.accelerator = coalesce(j.accelerator, '') AND s.labels = j.labels
             AND s.secrets = CASE WHEN j.secrets = '[]' THEN '[]'
                                  ELSE json_object('project', j.project_id, 'names', json(j.secrets)) END;
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
CREATE VIEW project_load AS
SELECT j.project_id, sum(j.gpus) + CASE WHEN max(t.gpu_share) > 0 THEN sum(t.gpu_share) ELSE 0 END AS gpus_in_use, count(DISTINCT j.id) AS running_jobs
FROM jobs j
JOIN tasks t ON t.job_id = j.id AND t.state IN ('assigned', 'running')
WHERE j.state = 'running'
GROUP BY j.project_id;
CREATE VIEW project_quota_use AS
SELECT p.id AS project_id, p.name, p.gpu_quota AS nominal, p.gpu_borrow AS borrow, p.weight,
       coalesce(l.gpus_in_use, 0) AS gpus_in_use, coalesce(l.running_jobs, 0) AS running_jobs,
       CASE WHEN p.gpu_quota IS NULL THEN 0 ELSE max(coalesce(l.gpus_in_use, 0) - p.gpu_quota, 0) END AS borrowed,
       (SELECT coalesce(sum(g.queued), 0) FROM queue_groups g WHERE g.project_id = p.id) AS queued_tasks
FROM projects p
LEFT JOIN project_load l ON l.project_id = p.id;
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
      JOIN task_queue h ON h.task_id IN (  -- the group's best, of jobs the worker holds none of (or arrays)
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
