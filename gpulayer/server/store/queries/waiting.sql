-- The facts scheduler/waiting.py puts in words: why a queued job (or a running service's
-- queued replica, an array's released element) is not placed. SQL reads each online worker's
-- fit once (job_worker_fit, the view acquire and gang placement read); waiting.py answers the
-- question from those rows. One query of the whole answer compiled to ~19,000 SQLite
-- instructions (~30-60 ms of CPU the first time each connection prepared it: the view was
-- expanded once per mention); these prepare in ~1-2 ms.

-- name: job_waiting_fit --
-- The job (its size, labels and width; no row when it is neither queued nor running) and each
-- online worker its shape's fit reads, one row per worker by id (worker_id NULL: none online):
-- the fit's flags, the worker's name, size and labels, its cordon (state, reason; NULL: schedulable)
-- and its GPUs out of service (worker_gpus.healthy = 0). `same`: the job's `same` label keys (JSON).
WITH j AS (SELECT id, labels, accelerator, gpus, cpus, memory_mb, width, gang, array_size, project_id,
                  gpu_fraction, gpu_memory_mb, gpu_link, json_extract(spec, '$.same') AS same
           FROM jobs WHERE id = CAST(:job_id AS INTEGER) AND state IN ('queued', 'running'))
SELECT j.labels, j.accelerator, j.gpus, j.cpus, j.memory_mb, j.width, j.gang, j.array_size, j.project_id,
       j.gpu_fraction, j.gpu_memory_mb, j.gpu_link, j.same,
       o.worker_id, o.has_labels, o.has_accelerator, o.big_enough, o.missing_secret, o.fits_now,
       o.name, o.worker_gpus, o.worker_cpus, o.worker_memory_mb, o.cordon, o.cordon_reason, o.unhealthy_gpus,
       o.worker_labels
FROM j LEFT JOIN (
    SELECT f.worker_id, f.has_labels, f.has_accelerator, f.big_enough, f.missing_secret, f.fits_now,
           w.name, w.gpus AS worker_gpus, w.cpus AS worker_cpus, w.memory_mb AS worker_memory_mb,
           w.labels AS worker_labels,
           c.state AS cordon, c.reason AS cordon_reason,
           (SELECT count(*) FROM worker_gpus g WHERE g.worker_id = w.id AND g.healthy = 0) AS unhealthy_gpus
    FROM job_worker_fit f JOIN workers w ON w.id = f.worker_id
    LEFT JOIN worker_cordons c ON c.worker_id = f.worker_id
    WHERE f.job_id = CAST(:job_id AS INTEGER) AND f.worker_state = 'online'
) o ON 1
ORDER BY o.worker_id;

-- name: job_waiting_secret --
-- The labels of the job's project's secret :name (NULL: it is not set).
SELECT labels FROM secrets WHERE project_id = :project_id AND name = :name;

-- name: job_waiting_unhealthy --
-- The GPUs out of service of the workers :workers (a JSON list of ids), by worker and index.
SELECT worker_id, "index", reason FROM worker_gpus
WHERE healthy = 0 AND worker_id IN (SELECT value FROM json_each(:workers))
ORDER BY worker_id, "index";
