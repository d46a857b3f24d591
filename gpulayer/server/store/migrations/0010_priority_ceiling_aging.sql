-- Version 10: a ceiling on the priority a project's members may ask for, and aging of waiting work
-- (issue 22, item 6; docs/teams.md, "Priority"). projects.max_priority (default 0: members may only
-- lower their priority, as Slurm's --nice; admins are not bound). task_queue.aged is the age boost
-- upkeep applied (one step per hour waited, capped), task_queue.since when the task became
-- eligible; tasks.queued_at carries the release time of a held task into the trigger. Acquire and
-- preemption order by priority + aged through task_queue_shape, made again on that expression.
-- Queued tasks of an older file age from their creation.

ALTER TABLE projects ADD COLUMN max_priority INTEGER NOT NULL DEFAULT 0
    CHECK (max_priority BETWEEN -1000000 AND 1000000);
ALTER TABLE tasks ADD COLUMN queued_at REAL;
ALTER TABLE task_queue ADD COLUMN aged INTEGER NOT NULL DEFAULT 0 CHECK (aged >= 0);
ALTER TABLE task_queue ADD COLUMN since REAL NOT NULL DEFAULT 0;
UPDATE task_queue SET since = (SELECT t.created_at FROM tasks t WHERE t.id = task_queue.task_id);

DROP INDEX task_queue_shape;
-- By shape, then project and user (queue_groups), best first (priority with its age): acquire takes
-- each admitted group's best task from here.
CREATE INDEX task_queue_shape ON task_queue (shape_id, project_id, user_id, priority + aged DESC, task_id);
-- Aging's upkeep: per step reached, the rows waiting long enough for the next (a seek per step).
CREATE INDEX task_queue_aging ON task_queue (aged, since);

DROP TRIGGER tasks_queued_insert;
DROP TRIGGER tasks_queued_again;
CREATE TRIGGER tasks_queued_insert AFTER INSERT ON tasks WHEN new.state = 'queued' AND new.held = 0 BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority, since)
    SELECT new.id, js.shape_id, new.job_id, new.priority, coalesce(new.queued_at, new.created_at)
    FROM job_shape js WHERE js.job_id = new.job_id;
END;
CREATE TRIGGER tasks_queued_again AFTER UPDATE OF state, held ON tasks
WHEN new.state = 'queued' AND new.held = 0 AND NOT (old.state = 'queued' AND old.held = 0) BEGIN
    INSERT INTO task_queue (task_id, shape_id, job_id, priority, since)
    SELECT new.id, js.shape_id, new.job_id, new.priority, coalesce(new.queued_at, new.created_at)
    FROM job_shape js WHERE js.job_id = new.job_id;
END;
