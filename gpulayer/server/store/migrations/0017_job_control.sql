-- Version 17: job control (issue 27): `jobs.hold` (submit --hold, job hold/release) and `jobs.begin_at`
-- (submit --begin); a job held or not yet begun waits (state waiting, its tasks held out of task_queue).
ALTER TABLE jobs ADD COLUMN hold INTEGER NOT NULL DEFAULT 0 CHECK (hold IN (0, 1));
ALTER TABLE jobs ADD COLUMN begin_at REAL;
-- `hold` (submit --hold, job hold): it waits until released; `begin_at` (submit --begin): it waits until
-- then. Upkeep releases the waiting jobs whose time came from this index alone (jobcontrol.begin_due).
CREATE INDEX jobs_begin_at ON jobs (begin_at) WHERE state = 'waiting' AND begin_at IS NOT NULL;
