-- The queries of scheduler/gpu_samples.py: GPU telemetry written per upkeep tick, read by `job status`.

-- name: insert_gpu_samples --
-- One upkeep tick's samples in one statement: :samples is [[worker id, GPU index, at, utilization %,
-- memory used MiB, memory total MiB], ...] (runtime/gpu_samples.py's Buffer.take).
INSERT INTO gpu_samples (worker_id, gpu_index, at, utilization_pct, memory_used_mb, memory_total_mb)
SELECT json_extract(s.value, '$[0]'), json_extract(s.value, '$[1]'), json_extract(s.value, '$[2]'),
       json_extract(s.value, '$[3]'), json_extract(s.value, '$[4]'), json_extract(s.value, '$[5]')
FROM json_each(:samples) AS s;

-- name: job_gpu_usage --
-- `job status`: each running task of a job (or of its element :index), its worker, each GPU it holds
-- with the UUID its agent reported and the newest sample of that GPU since the task started (a seek
-- per GPU on gpu_samples_gpu). At most :n rows.
SELECT t.id AS task_id, t."index" AS "index", t.attempt, t.worker_id, w.name AS worker_name,
       g.value AS gpu_index, wg.uuid, s.at, s.utilization_pct, s.memory_used_mb, s.memory_total_mb
FROM tasks t
JOIN workers w ON w.id = t.worker_id
LEFT JOIN json_each(t.gpu_indices) AS g
LEFT JOIN worker_gpus wg ON wg.worker_id = t.worker_id AND wg."index" = g.value
LEFT JOIN gpu_samples s ON s.rowid = (
    SELECT x.rowid FROM gpu_samples x
    WHERE x.worker_id = t.worker_id AND x.gpu_index = g.value AND x.at >= coalesce(t.started_at, 0)
    ORDER BY x.at DESC LIMIT 1)
WHERE t.job_id = :job_id AND t.state = 'running' AND (:index IS NULL OR t."index" = :index)
ORDER BY t."index", t.id, g.value
LIMIT :n;
