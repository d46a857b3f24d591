-- Invariants of a state file after faults (crash, partition, chaos).
-- Each block returns the rows that break it: no row back means it holds.
-- Read by tests/faultlib.py (check_state); the event-log replay that needs
-- ordering lives there in Python.

-- name: integrity --
-- SQLite's own check of the file; one row 'ok' when sound (checked apart).
PRAGMA integrity_check;

-- name: active_task_without_live_worker --
-- A task assigned or running is held by a worker that is online: a worker that
-- went offline or left lost its tasks in the same transaction.
SELECT t.id AS task_id, t.state, t.worker_id, w.state AS worker_state
FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
WHERE t.state IN ('assigned', 'running') AND (w.id IS NULL OR w.state <> 'online');

-- name: two_active_copies --
-- One replica or rank of a job is active at most once (one attempt at a time).
SELECT job_id, "index", count(*) AS active
FROM tasks WHERE state IN ('assigned', 'running')
GROUP BY job_id, "index" HAVING count(*) > 1;

-- name: task_of_two_workers --
-- A task row is handed to one worker in its life (retries make new rows).
SELECT task_id, count(DISTINCT worker_id) AS workers
FROM events WHERE kind = 'task_assigned'
GROUP BY task_id HAVING count(DISTINCT worker_id) > 1;

-- name: task_worker_disagrees_with_events --
-- The worker on a task row is the one its task_assigned event named.
SELECT t.id AS task_id, t.worker_id, e.worker_id AS assigned_to
FROM tasks t JOIN events e ON e.kind = 'task_assigned' AND e.task_id = t.id
WHERE t.worker_id IS NOT e.worker_id;

-- name: over_slots --
-- A worker never holds more tasks than its slots.
SELECT w.id AS worker_id, w.slots, count(t.id) AS held
FROM workers w JOIN tasks t ON t.worker_id = w.id AND t.state IN ('assigned', 'running')
GROUP BY w.id HAVING count(t.id) > w.slots;

-- name: job_without_submit_event --
-- Every job row was written with its job_submitted event.
SELECT j.id AS job_id FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.kind = 'job_submitted' AND e.job_id = j.id);

-- name: job_end_disagrees_with_events --
-- A job is final exactly when it has one job_finished event, naming its state.
SELECT j.id AS job_id, j.state,
       (SELECT count(*) FROM events e WHERE e.kind = 'job_finished' AND e.job_id = j.id) AS finished_events
FROM jobs j
WHERE (SELECT count(*) FROM events e WHERE e.kind = 'job_finished' AND e.job_id = j.id)
      <> (j.state IN ('succeeded', 'failed', 'cancelled', 'lost'))
   OR (j.state IN ('succeeded', 'failed', 'cancelled', 'lost') AND NOT EXISTS (
        SELECT 1 FROM events e WHERE e.kind = 'job_finished' AND e.job_id = j.id
          AND json_extract(e.data, '$.state') = j.state));

-- name: stuck_job --
-- A job still queued or running has a task of its current attempt that can
-- still move (queued, assigned or running); otherwise it would never end. An
-- array's elements count their own attempts: any task of it that can move will do.
-- A waiting job has a dependency that has not ended, unless it is being cancelled (its reason
-- set: the cascade's next steps end it, after a restart too; scheduler/cascades.py).
SELECT j.id AS job_id, j.state, j.attempt FROM jobs j
WHERE (j.state IN ('queued', 'running') AND NOT EXISTS (
    SELECT 1 FROM tasks t WHERE t.job_id = j.id AND (t.attempt = j.attempt OR j.array_size IS NOT NULL)
      AND t.state IN ('queued', 'assigned', 'running')))
   OR (j.state = 'waiting' AND j.reason IS NULL AND NOT EXISTS (
    SELECT 1 FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
    WHERE d.job_id = j.id AND a.finished_at IS NULL));

-- name: ended_job_with_active_task --
-- A job that ended holds no worker, except running tasks it asked to stop
-- (cancel_requested: their worker kills them at its next heartbeat).
SELECT t.id AS task_id, t.job_id, j.state AS job_state, t.state
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE j.state IN ('succeeded', 'failed', 'cancelled', 'lost') AND t.state IN ('queued', 'assigned', 'running')
  AND NOT (t.state = 'running' AND t.cancel_requested = 1);

-- name: events_for_replay --
-- The task holding events in order, for the replay in faultlib.replay.
SELECT seq, at, kind, job_id, task_id, worker_id, data FROM events
WHERE kind IN ('task_assigned', 'task_started', 'task_finished', 'task_lost', 'task_stopped',
               'task_cancelled', 'task_requeued', 'gang_released', 'worker_offline', 'worker_online', 'worker_gone',
               'job_retried', 'job_finished', 'late_finish')
ORDER BY seq;

-- name: task_queue_disagrees --
-- task_queue holds exactly the queued tasks, each under its job's shape (kept by triggers).
SELECT t.id AS task_id, t.state, q.shape_id, js.shape_id AS job_shape
FROM tasks t
LEFT JOIN task_queue q ON q.task_id = t.id
LEFT JOIN job_shape js ON js.job_id = t.job_id
WHERE (t.state = 'queued' AND t.held = 0) <> (q.task_id IS NOT NULL) OR q.shape_id IS NOT js.shape_id AND q.task_id IS NOT NULL;

-- name: shape_count_wrong --
-- shapes.queued counts the shape's rows of task_queue.
SELECT s.id AS shape_id, s.queued, (SELECT count(*) FROM task_queue q WHERE q.shape_id = s.id) AS rows
FROM shapes s
WHERE s.queued <> (SELECT count(*) FROM task_queue q WHERE q.shape_id = s.id);

-- name: queue_group_count_wrong --
-- queue_groups counts each (shape, project, user)'s rows of task_queue, which carry their job's project and user.
SELECT g.shape_id, g.project_id, g.user_id, g.queued, count(q.task_id) AS rows
FROM queue_groups g
LEFT JOIN task_queue q ON q.shape_id = g.shape_id AND q.project_id = g.project_id AND q.user_id = g.user_id
GROUP BY g.shape_id, g.project_id, g.user_id
HAVING g.queued <> count(q.task_id)
UNION ALL
SELECT q.shape_id, q.project_id, q.user_id, NULL, count(*) FROM task_queue q
JOIN jobs j ON j.id = q.job_id
WHERE j.project_id <> q.project_id OR j.user_id <> q.user_id
   OR NOT EXISTS (SELECT 1 FROM queue_groups g WHERE g.shape_id = q.shape_id AND g.project_id = q.project_id
                                                 AND g.user_id = q.user_id)
GROUP BY q.shape_id, q.project_id, q.user_id;

-- name: active_task_on_unhealthy_gpu --
-- No task holds a GPU its worker reported unhealthy: the heartbeat that stored the fault
-- lost the tasks on it, and placement reserves no unhealthy index.
SELECT t.id AS task_id, t.worker_id, g."index"
FROM tasks t, json_each(t.gpu_indices) i
JOIN worker_gpus g ON g.worker_id = t.worker_id AND g."index" = i.value AND g.healthy = 0
WHERE t.state IN ('assigned', 'running');

-- name: drained_worker_with_task --
-- A drained worker holds no task (draining ends there; a cordon gives no new one).
SELECT c.worker_id, t.id AS task_id
FROM worker_cordons c JOIN tasks t ON t.worker_id = c.worker_id AND t.state IN ('assigned', 'running')
WHERE c.state = 'drained';
