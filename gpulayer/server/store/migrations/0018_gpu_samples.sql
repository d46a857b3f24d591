-- Version 18: GPU telemetry (issue 28 part 4): per-GPU utilization and memory, downsampled to one
-- row per GPU per heartbeat interval, written by upkeep (scheduler/gpu_samples.py), pruned by retention.
CREATE TABLE gpu_samples (
    worker_id        INTEGER NOT NULL,
    gpu_index        INTEGER NOT NULL,
    at               REAL NOT NULL,
    utilization_pct  REAL,      -- mean over the interval, 0 to 100 (NULL: NVML could not tell)
    memory_used_mb   INTEGER,   -- the most used during the interval, MiB
    memory_total_mb  INTEGER
) STRICT;
-- Retention prunes the oldest first; charts read a time window.
CREATE INDEX gpu_samples_at ON gpu_samples (at);
-- The newest sample of one GPU (`job status`), one GPU's series.
CREATE INDEX gpu_samples_gpu ON gpu_samples (worker_id, gpu_index, at);
