-- The queries of scheduler/teams.py: users, projects, memberships, quotas' and priority's settings.

-- name: user_by_id --
-- The user a client token belongs to (authentication caches the answer).
SELECT id, name, admin, max_running_jobs, created_at, removed_at FROM users WHERE id = :user_id;

-- name: user_by_name --
-- One user by name, removed or not.
SELECT id, name, admin, max_running_jobs, created_at, removed_at FROM users WHERE name = :name;

-- name: insert_user --
-- A new user; a removed one of the same name comes back (its jobs are still its own).
INSERT INTO users (name, admin, max_running_jobs, created_at) VALUES (:name, :admin, :max_running_jobs, :now)
ON CONFLICT (name) DO UPDATE SET admin = excluded.admin, max_running_jobs = excluded.max_running_jobs,
                                 removed_at = NULL
WHERE users.removed_at IS NOT NULL
RETURNING id;

-- name: update_user --
-- Change a user's admin flag or running-jobs limit (:set_limit 1 to change the limit, NULL clears it).
UPDATE users SET admin = coalesce(:admin, admin),
                 max_running_jobs = CASE WHEN :set_limit THEN :max_running_jobs ELSE max_running_jobs END
WHERE id = :user_id AND removed_at IS NULL RETURNING id;

-- name: remove_user --
-- A user leaves: marked removed (its jobs keep their owner), out of every project.
UPDATE users SET removed_at = :now WHERE id = :user_id AND removed_at IS NULL RETURNING id;

-- name: remove_user_memberships --
-- Every membership of a user.
DELETE FROM memberships WHERE user_id = :user_id;

-- name: revoke_user_tokens --
-- Every live client token of a user stops working.
UPDATE tokens SET revoked_at = :now WHERE user_id = :user_id AND revoked_at IS NULL RETURNING jti;

-- name: list_users --
-- Users that are not removed, with their projects and roles (a JSON list): by name, after :after, at most
-- :limit (-1: all).
SELECT u.id, u.name, u.admin, u.max_running_jobs, u.created_at,
       (SELECT json_group_array(json_object('project', p.name, 'role', m.role))
        FROM memberships m JOIN projects p ON p.id = m.project_id WHERE m.user_id = u.id) AS projects
FROM users u WHERE u.removed_at IS NULL AND u.name > :after ORDER BY u.name LIMIT :limit;

-- name: user_projects --
-- The projects of a user, with its role in each, by name.
SELECT p.id, p.name, m.role FROM memberships m JOIN projects p ON p.id = m.project_id
WHERE m.user_id = :user_id ORDER BY p.name;

-- name: project_by_name --
-- One project by name.
SELECT id, name, visibility, gpu_quota, gpu_borrow, weight, max_priority, created_at, idle_timeout_s, idle_below_pct,
       idle_action
FROM projects WHERE name = :name;

-- name: insert_project --
-- A new project (the unique name refuses a second of the same name). Its id is past every id a removed
-- project left behind in jobs, usage and fair share (each read from an index), so that a new project never
-- inherits an old one's jobs, runs or share.
INSERT INTO projects (id, name, visibility, gpu_quota, gpu_borrow, weight, max_priority, created_at)
VALUES (1 + max(coalesce((SELECT max(id) FROM projects), 0), coalesce((SELECT max(project_id) FROM jobs), 0),
                coalesce((SELECT max(project_id) FROM usage), 0), coalesce((SELECT max(project_id) FROM fairshare), 0)),
        :name, :visibility, :gpu_quota, :gpu_borrow, :weight, :max_priority, :now) RETURNING id;

-- name: update_project --
-- Change what was given of a project's settings (:set_quota / :set_weight / :set_idle_* 1 to change those, NULL
-- clears them).
UPDATE projects SET visibility = coalesce(:visibility, visibility), gpu_borrow = coalesce(:gpu_borrow, gpu_borrow),
                    max_priority = coalesce(:max_priority, max_priority),
                    gpu_quota = CASE WHEN :set_quota THEN :gpu_quota ELSE gpu_quota END,
                    weight = CASE WHEN :set_weight THEN :weight ELSE weight END,
                    idle_timeout_s = CASE WHEN :set_idle_timeout THEN :idle_timeout_s ELSE idle_timeout_s END,
                    idle_below_pct = CASE WHEN :set_idle_below THEN :idle_below_pct ELSE idle_below_pct END,
                    idle_action = CASE WHEN :set_idle_action THEN :idle_action ELSE idle_action END
WHERE id = :project_id RETURNING id;

-- name: project_active_jobs --
-- How many jobs of a project have not ended (a project with some cannot be removed).
SELECT count(*) AS n FROM jobs INDEXED BY jobs_project_state
WHERE project_id = :project_id AND finished_at IS NULL;

-- name: delete_project_memberships --
-- Everyone leaves a project that is removed.
DELETE FROM memberships WHERE project_id = :project_id;

-- name: delete_project_secrets --
-- The secrets of a project that is removed.
DELETE FROM secrets WHERE project_id = :project_id;

-- name: name_project_usage --
-- A project about to be removed: its usage rows keep its name (reports name it, not `#id`).
UPDATE usage SET project_name = :name WHERE project_id = :project_id AND project_name IS NULL;

-- name: delete_project --
-- Remove a project (its ended jobs keep its id; they read as project NULL).
DELETE FROM projects WHERE id = :project_id RETURNING id;

-- name: list_projects --
-- Projects, all (:user_id NULL: an admin) or those :user_id is in, with their members (a JSON list): by
-- name, after :after, at most :limit (-1: all).
SELECT p.id, p.name, p.visibility, p.gpu_quota, p.gpu_borrow, p.weight, p.max_priority, p.created_at,
       p.idle_timeout_s, p.idle_below_pct, p.idle_action,
       (SELECT json_group_array(json_object('user', u.name, 'role', m.role))
        FROM memberships m JOIN users u ON u.id = m.user_id WHERE m.project_id = p.id) AS members
FROM projects p
WHERE (:user_id IS NULL OR EXISTS (SELECT 1 FROM memberships m WHERE m.project_id = p.id AND m.user_id = :user_id))
  AND p.name > :after
ORDER BY p.name LIMIT :limit;

-- name: put_membership --
-- Add a user to a project as :role, or change its role there.
INSERT INTO memberships (user_id, project_id, role) VALUES (:user_id, :project_id, :role)
ON CONFLICT (user_id, project_id) DO UPDATE SET role = excluded.role;

-- name: delete_membership --
-- A user leaves a project.
DELETE FROM memberships WHERE user_id = :user_id AND project_id = :project_id RETURNING role;

-- name: membership_role --
-- A user's role in a project, if any.
SELECT role FROM memberships WHERE user_id = :user_id AND project_id = :project_id;

-- name: project_priority_ceiling --
-- The highest priority a project's members may give a job (projects.max_priority), and its name.
SELECT name, max_priority FROM projects WHERE id = :project_id;

-- name: job_owners --
-- The owner and project names of the jobs in :ids (a JSON list), and who owns each and :user_id's role
-- in its project: what the ownership rules read (teams.job_meta).
SELECT j.id, u.name AS owner, p.name AS project, j.user_id, p.visibility, m.role
FROM jobs j LEFT JOIN users u ON u.id = j.user_id LEFT JOIN projects p ON p.id = j.project_id
LEFT JOIN memberships m ON m.project_id = j.project_id AND m.user_id = :user_id
WHERE j.id IN (SELECT value FROM json_each(:ids));
