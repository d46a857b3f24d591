-- The queries of scheduler/forecast.py: what the forward replay of the placement rules reads in its copy.

-- name: forecast_waiting --
-- The jobs that wait to start (queued, or waiting for a begin time, a dependency or a release), in
-- the order the claim would look at them (priority, then first come), with what keeps each back that
-- the replay cannot foresee: a hold, a dependency not ended yet, a cancel in progress. :job_id: that
-- job's row alone (a what-if's, just queued in the copy); NULL: all.
SELECT j.id, j.state, j.hold, j.begin_at, j.reason,
       EXISTS (SELECT 1 FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
               WHERE d.job_id = j.id AND a.finished_at IS NULL) AS after_open,
       (SELECT min(d.after_job_id) FROM job_dependencies d JOIN jobs a ON a.id = d.after_job_id
        WHERE d.job_id = j.id AND a.finished_at IS NULL) AS after_job
FROM jobs j INDEXED BY jobs_state_id
WHERE j.state IN ('queued', 'waiting') AND (:job_id IS NULL OR j.id = :job_id)
ORDER BY j.priority DESC, j.id;

-- name: forecast_active_tasks --
-- The tasks running now, since when (those assigned and not started start in the replay at its first step).
SELECT id, job_id, worker_id, started_at AS since
FROM tasks WHERE state IN ('assigned', 'running') AND state = 'running';

-- name: forecast_assigned --
-- The tasks assigned and not started: in the replay, each starts when it is assigned.
SELECT t.id, t.job_id, t.worker_id, w.name AS worker
FROM tasks t JOIN workers w ON w.id = t.worker_id
WHERE t.state IN ('assigned', 'running') AND t.state = 'assigned'
ORDER BY t.id;

-- name: forecast_workers --
-- The online workers whose free room now could hold one task of some queued shape (size alone: a
-- necessary condition of any claim, cheap to read): those that poll at this step of the replay, by id
-- (cordoned ones too: the claim refuses them). The others would find nothing.
SELECT l.worker_id AS id FROM worker_load l
WHERE l.state = 'online' AND l.free_slots > 0
  AND EXISTS (SELECT 1 FROM shapes s INDEXED BY shapes_queued
              WHERE s.queued > 0 AND s.gpus <= l.free_gpus AND s.cpus <= l.free_cpus
                AND s.memory_mb <= l.free_memory_mb)
ORDER BY l.worker_id;

-- name: forecast_durations --
-- How long each active job's tasks are expected to run, in seconds: its typical run (job_runtime_model's
-- typical_s: learned from the user's runs, else its limit scaled by how much of their limits recent jobs
-- used, else its limit or the default), what an estimate uses; NULL for a service (it never ends).
SELECT m.job_id, CASE WHEN j.kind = 'service' THEN NULL ELSE m.typical_s END AS seconds
FROM job_runtime_model m JOIN jobs j ON j.id = m.job_id;

-- name: forecast_run_samples --
-- What the typical run of each running job (not a service) is learned from, for the expected end of a task
-- that has run a while (forecast.py's conditional median): its time limit, its user's latest ended runs (at
-- most 20, as job_runtime_model reads them: the same name, or the same command for an unnamed job) as a
-- JSON array of seconds, and the run time over time limit of the cluster's latest 200 ended runs that had
-- a limit (job_runtime_model's limit_ratio samples), a JSON array.
SELECT j.id AS job_id, json_extract(j.spec, '$.timeout_seconds') AS limit_s,
       (SELECT json_group_array(x.run_s)
        FROM (SELECT u.ended_at - u.started_at AS run_s FROM usage u
              WHERE u.user_id = j.user_id AND u.job_name IS j.name
                AND u.outcome IN ('succeeded', 'failed', 'timed_out')
                AND (j.name IS NOT NULL
                     OR (SELECT json_extract(o.spec, '$.command') FROM jobs o WHERE o.id = u.job_id)
                        = json_extract(j.spec, '$.command'))
              ORDER BY u.ended_at DESC LIMIT 20) x) AS runs,
       r.ratios
FROM jobs j INDEXED BY jobs_state_id
CROSS JOIN (SELECT json_group_array(x.ratio) AS ratios
            FROM (SELECT (u.ended_at - u.started_at) / json_extract(o.spec, '$.timeout_seconds') AS ratio
                  FROM (SELECT * FROM usage ORDER BY ended_at DESC LIMIT 200) u
                  JOIN jobs o ON o.id = u.job_id
                  WHERE u.outcome IN ('succeeded', 'failed', 'timed_out')
                    AND json_extract(o.spec, '$.timeout_seconds') > 0) x) r
WHERE j.state = 'running' AND j.kind <> 'service';

-- name: forecast_durations_of --
-- forecast_durations for one job (queued in the copy after they were read: a what-if).
SELECT CASE WHEN j.kind = 'service' THEN NULL ELSE m.typical_s END AS seconds
FROM job_runtime_model m JOIN jobs j ON j.id = m.job_id
WHERE m.job_id = :job_id;

-- name: forecast_next_begin --
-- The earliest begin time still to come (`--begin`), after :now; NULL when none.
SELECT min(begin_at) AS at FROM jobs INDEXED BY jobs_begin_at
WHERE state = 'waiting' AND begin_at IS NOT NULL AND begin_at > :now;

-- name: forecast_clear --
-- The last forecast's rows go: the next one's replace them whole.
DELETE FROM estimates;

-- name: forecast_insert --
-- One estimated job's row of the latest forecast (:workers a JSON array of names).
INSERT INTO estimates (job_id, start_at, reason, workers, forecast_at)
VALUES (:job_id, :start_at, :reason, :workers, :forecast_at);
