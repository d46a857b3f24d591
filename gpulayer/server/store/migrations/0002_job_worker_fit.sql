-- Version 2: the view job_worker_fit, the one definition of which worker a job fits.

-- Which workers a job fits, and why not: the one definition of fit that acquire, gang
-- placement, waiting reasons, provisioning and the explorer read. One row per job and
-- worker, whatever their states (filter on job_state / worker_state). Flags are 0 or 1:
--   has_labels       every label the job asks for is on the worker, with the same value
--   has_accelerator  the job asks for none, or the worker has GPUs
--   big_enough       the worker's GPUs, CPUs and memory cover one task, when idle
--   missing_secret   the first of the job's secrets (by name) that is not set or whose labels
--                    the worker's join token does not all carry; NULL when it may have them all
--   fits             all four: the worker could run a task of the job when idle
--   has_room         a free slot, and free GPUs, CPUs and memory for one task now (worker_load)
--   holds_task       it holds an active task of the job already (one replica per worker)
--   fits_now         online, fits, has room, holds none: acquire would give it a task of the job
--   spare_gpus       free GPUs left after one task (gang placement packs the tightest first)
CREATE VIEW job_worker_fit AS
SELECT p.*,
       (p.has_labels AND p.has_accelerator AND p.big_enough AND p.missing_secret IS NULL) AS fits,
       (p.worker_state = 'online' AND p.has_labels AND p.has_accelerator AND p.big_enough
        AND p.missing_secret IS NULL AND p.has_room AND NOT p.holds_task) AS fits_now
FROM (
    SELECT j.id AS job_id, j.state AS job_state, l.worker_id, w.state AS worker_state,
           (j.labels = '{}' OR NOT EXISTS (
               SELECT 1 FROM json_each(j.labels) jl
               WHERE NOT EXISTS (SELECT 1 FROM json_each(w.labels) wl
                                 WHERE wl.key = jl.key AND wl.value = jl.value))) AS has_labels,
           (j.accelerator IS NULL OR w.gpus > 0) AS has_accelerator,
           (j.gpus <= w.gpus AND j.cpus <= w.cpus AND j.memory_mb <= w.memory_mb) AS big_enough,
           CASE WHEN j.secrets <> '[]' THEN (
               SELECT s.value FROM json_each(j.secrets) s
               LEFT JOIN secrets sc ON sc.name = s.value
               WHERE sc.name IS NULL  -- deleted since submit: wait until it is set again
                  OR EXISTS (SELECT 1 FROM json_each(sc.labels) sl
                             WHERE NOT EXISTS (SELECT 1 FROM json_each(w.token_labels) tl
                                               WHERE tl.key = sl.key AND tl.value = sl.value))
               ORDER BY s.value LIMIT 1)
           END AS missing_secret,
           (l.free_slots > 0 AND j.gpus <= l.free_gpus AND j.cpus <= l.free_cpus
            AND j.memory_mb <= l.free_memory_mb) AS has_room,
           EXISTS (SELECT 1 FROM tasks o
                   WHERE o.worker_id = w.id AND o.job_id = j.id AND o.state IN ('assigned', 'running')) AS holds_task,
           l.free_gpus - j.gpus AS spare_gpus
    FROM jobs j, workers w
    JOIN worker_load l ON l.worker_id = w.id
) p;
