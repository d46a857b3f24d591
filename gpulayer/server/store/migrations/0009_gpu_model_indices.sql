-- Version 9: `--gpu-model` on a worker with mixed GPUs (MIG profiles, or models): a
-- `gpu_model` label is met by a worker with a GPU of that model, and only its GPUs of that
-- model count for big_enough and has_room (issue 18); placement gives the task indices of
-- that model. A worker whose every GPU is that model is met as before; a worker labelled
-- gpu_model=X (--label) counts all its GPUs, as before. shape_worker_fit is made again exactly
-- as schema.sql has it: this is the last migration, so a later change to it in schema.sql is
-- mirrored here. worker_load and job_worker_fit are unchanged (the latter reads
-- shape_worker_fit by name).

DROP VIEW shape_worker_fit;

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
--                    a `gpu_model` met by the GPUs (not by a worker label) counts those of it
--   missing_secret   the first of the shape's secrets (by name) that is not set in its project
--                    or whose labels the worker's join token does not all carry; NULL when it
--                    may have them all
--   fits             all four: the worker could run a task of the shape when idle
--   has_room         a free slot, and free GPUs, CPUs and memory for one task now (worker_load);
--                    for more than one GPU on a worker with MIG instances, as many free whole
--                    GPUs (healthy, held by no task); for a `gpu_model` met by the GPUs, as
--                    many free GPUs of that model
--   schedulable      not cordoned, draining or drained (worker_cordons)
--   fits_now         online, schedulable, fits, has room: it could take a task of the shape of
--                    a job it holds no task of (job_worker_fit.holds_task)
--   spare_gpus       free GPUs left after one task (gang placement packs the tightest first)
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
            AND (s.gpus = 0 OR s.labels = '{}' OR json_extract(s.labels, '$.gpu_model') IS NULL
                 OR json_extract(s.labels, '$.gpu_model') IS json_extract(w.labels, '$.gpu_model')
                 OR s.gpus <= (SELECT count(*) FROM json_each(w.gpu_models) m  -- its GPUs of that model
                               WHERE m.value = json_extract(s.labels, '$.gpu_model')
                                 AND (s.gpus = 1 OR NOT EXISTS (SELECT 1 FROM worker_gpus g
                                                                WHERE g.worker_id = w.id AND g."index" = m.key
                                                                  AND g.uuid GLOB 'MIG-*')))))
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
                                                   AND x.value = m.key)))) AS has_room,
           l.free_gpus - s.gpus AS spare_gpus,
           NOT EXISTS (SELECT 1 FROM worker_cordons c WHERE c.worker_id = w.id) AS schedulable
    FROM shapes s, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;
