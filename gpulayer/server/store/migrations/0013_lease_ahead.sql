-- Version 13: array elements leased ahead (issue 25, item 3): `tasks.ahead` marks an element assigned
-- to a worker beyond its free slots, not started there; worker_load counts none of them against the
-- worker's room.
ALTER TABLE tasks ADD COLUMN ahead INTEGER NOT NULL DEFAULT 0 CHECK (ahead IN (0, 1));
DROP VIEW worker_load;
-- What each worker has and what is free on it now (an unhealthy GPU is never free).
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
LEFT JOIN tasks t ON t.worker_id = w.id AND t.state IN ('assigned', 'running') AND t.ahead = 0
LEFT JOIN jobs j ON j.id = t.job_id
GROUP BY w.id;

