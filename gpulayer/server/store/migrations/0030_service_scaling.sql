-- Version 30: services that follow their traffic (issue 39). `tasks.drain_deadline` marks a replica that is
-- leaving its service (scale-down, a rolling update): out of the ingress's set, its in-flight requests finish,
-- then upkeep stops it (service_drain.py); `drain_started_at` is when it left the set. service_scaling holds
-- every autoscaling decision, for ops: SELECT * FROM service_scaling WHERE job_id = 7 ORDER BY at.
ALTER TABLE tasks ADD COLUMN drain_deadline REAL;
ALTER TABLE tasks ADD COLUMN drain_started_at REAL;
-- The replicas draining now (upkeep looks at them each tick): a seek, not a walk of the tasks.
CREATE INDEX tasks_draining ON tasks (drain_deadline) WHERE drain_deadline IS NOT NULL AND state IN ('assigned', 'running');
-- Autoscaling decisions (service.autoscale): one row a change of a service's replica count, with what
-- made it (docs/services.md, "Autoscaling"): `why` up (load over target), down (under it), zero (idle,
-- released), wake (a request for a service at zero), min (below its min, e.g. after a replica was lost).
CREATE TABLE service_scaling (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL REFERENCES jobs (id),
    at            REAL NOT NULL,
    from_replicas INTEGER NOT NULL CHECK (from_replicas >= 0),
    to_replicas   INTEGER NOT NULL CHECK (to_replicas >= 0),
    why           TEXT NOT NULL CHECK (why IN ('up', 'down', 'zero', 'wake', 'min')),
    load          REAL,             -- requests in flight per ready replica through the ingress when decided
    in_flight     INTEGER,          -- requests in flight (and held for a cold start) in all
    ready         INTEGER           -- replicas ready (in the ingress's set) when decided
) STRICT;
CREATE INDEX service_scaling_job ON service_scaling (job_id, at);
-- The services that may scale (upkeep's autoscale step reads them each tick): a seek, not a walk of the jobs.
CREATE INDEX jobs_services_live ON jobs (id) WHERE kind = 'service' AND state IN ('queued', 'running');
-- A replica drained before it was placed ends at once (drain_queued_task): one more query makes queued -> cancelled.
UPDATE task_transitions SET made_by = 'cancel_element, cancel_queued_batch (a user cancels), stop_attempt_tasks (a sibling ended it), detach_running_tasks (a retry replaces the attempt), drain_queued_task (a replica drained before it was placed)'
WHERE from_state = 'queued' AND to_state = 'cancelled';
