-- Version 6: cordon, drain and per-GPU health (issue 18). Two tables (worker_cordons,
-- worker_gpus); worker_load counts unhealthy GPUs out of the free ones; shape_worker_fit gains
-- `schedulable` (no row in worker_cordons), which its fits_now (and so job_worker_fit's, which
-- reads it by name) requires. The two views are made again exactly as schema.sql has them: this
-- is the last migration, so a later change to either view in schema.sql is mirrored here.

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

DROP VIEW shape_worker_fit;
DROP VIEW worker_load;

CREATE VIEW worker_load AS
SELECT w.id AS worker_id, w.name, w.state, w.labels, w.slots, w.gpus, w.cpus, w.memory_mb,
       count(t.id) AS active_tasks,
       w.slots - count(t.id) AS free_slots,
       w.gpus - coalesce(sum(j.gpus), 0)
           - (SELECT count(*) FROM worker_gpus g WHERE g.worker_id = w.id AND g.healthy = 0) AS free_gpus,
       w.cpus - coalesce(sum(j.cpus), 0) AS free_cpus,
       w.memory_mb - coalesce(sum(j.memory_mb), 0) AS free_memory_mb,
       w.last_seen_at, w.lease_expires_at,
       (SELECT count(*) FROM worker_gpus g WHERE g.worker_id = w.id AND g.healthy = 0) AS unhealthy_gpus
FROM workers w
LEFT JOIN tasks t ON t.worker_id = w.id AND t.state IN ('assigned', 'running')
LEFT JOIN jobs j ON j.id = t.job_id
GROUP BY w.id;

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
                 AND NOT (jl.key = 'gpu_model' AND w.gpus > 0  -- every GPU (or MIG instance) is that model
                          AND NOT EXISTS (SELECT 1 FROM json_each(w.gpu_models) m WHERE m.value <> jl.value))))
           AS has_labels,
           (s.accelerator = '' OR w.gpus > 0) AS has_accelerator,
           (s.gpus <= w.gpus AND s.cpus <= w.cpus AND s.memory_mb <= w.memory_mb) AS big_enough,
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
            AND s.memory_mb <= l.free_memory_mb) AS has_room,
           l.free_gpus - s.gpus AS spare_gpus,
           NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id) AS schedulable
    FROM shapes s, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;
