-- The queries of scheduler/gpu_health.py: GPU health and resets as workers report them.

-- name: worker_gpus_of --
-- A worker's GPUs as the control plane knows them (health, reset pending), with its GPU count.
SELECT g."index", g.uuid, g.healthy, g.reason, g.changed_at, g.reset_pending
FROM worker_gpus g WHERE g.worker_id = :worker_id ORDER BY g."index";

-- name: worker_gpu_count --
-- How many GPUs a worker registered with (a reported index must be below it).
SELECT gpus FROM workers WHERE id = :worker_id;

-- name: put_worker_gpu --
-- Record one GPU's health as reported (a first report, a new fault, or a new UUID).
INSERT INTO worker_gpus (worker_id, "index", uuid, healthy, reason, changed_at)
VALUES (:worker_id, :index, :uuid, :healthy, :reason, :now)
ON CONFLICT (worker_id, "index") DO UPDATE
SET uuid = excluded.uuid, healthy = excluded.healthy, reason = excluded.reason, changed_at = excluded.changed_at;

-- name: reset_worker_gpu --
-- `gpulayer worker gpu-reset`: the GPU is healthy again; its agent is told on its next heartbeat.
UPDATE worker_gpus SET healthy = 1, reason = NULL, changed_at = :now, reset_pending = 1
WHERE worker_id = :worker_id AND "index" = :index
RETURNING "index", uuid;

-- name: reset_told --
-- The heartbeat answer carried the resets to an agent that reports no GPU health (so cannot mark one again).
UPDATE worker_gpus SET reset_pending = 0 WHERE worker_id = :worker_id AND reset_pending = 1;

-- name: reset_heard --
-- The agent applied the reset of this GPU (it echoed it, or reports the GPU healthy): stop telling it.
UPDATE worker_gpus SET reset_pending = 0 WHERE worker_id = :worker_id AND "index" = :index AND reset_pending = 1;

-- name: gpu_tasks_stop --
-- Active tasks holding one of the :indices (a JSON list) of a worker, not already being stopped:
-- their worker is told to stop them (cancel_requested), and reason gpu_unhealthy says why. They
-- stay active, holding every GPU index they have, until the worker reports them ended; then
-- they end lost (gpu_unhealthy), for the retry policy to judge (as worker_lost).
UPDATE tasks SET cancel_requested = 1, reason = 'gpu_unhealthy'
WHERE worker_id = :worker_id AND state IN ('assigned', 'running') AND cancel_requested = 0
  AND EXISTS (SELECT 1 FROM json_each(tasks.gpu_indices) g
              WHERE g.value IN (SELECT value FROM json_each(:indices)))
RETURNING id, job_id, attempt;
