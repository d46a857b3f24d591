-- Version 11: what acquire's admission reads, as views (issue 23, point 1): queue_group_quota
-- (each group of queued work against its project's nominal quota and borrowing, its share for
-- fair share) and user_running_jobs (each user's running-jobs limit and count), so that
-- acquire_task only claims, and next_gang_job, preemption_candidates and job_quota_reason
-- count a user's running jobs the one way. No table changes.

-- Each group of queued work (queue_groups: shape, project, user) as admission judges it: its
-- shape's GPUs, its project's `borrow` and share for fair share (its weight, else its nominal
-- quota, else 1), and `nominal_left`: the GPUs of the project's nominal quota left once one more
-- task of the group runs (the quota, less the GPUs its running jobs' active tasks hold, less the
-- task's; below 0 it would borrow), NULL when no quota bounds it (none set, or a task without
-- GPUs). acquire_task admits a group at nominal_left >= 0, or up to `borrow` beyond while no
-- other project's group that the worker could take is within its own nominal quota.
CREATE VIEW queue_group_quota AS
SELECT g.shape_id, g.project_id, g.user_id, s.gpus, p.gpu_borrow AS borrow,
       coalesce(p.weight, nullif(p.gpu_quota, 0), 1) AS share,
       CASE WHEN p.gpu_quota IS NULL OR s.gpus = 0 THEN NULL ELSE p.gpu_quota - s.gpus - (
           SELECT coalesce(sum(j.gpus), 0) FROM jobs j  -- project_load.gpus_in_use, of this project only
           -- (the redundant IN term seeks tasks_job_active by state, not a running array's every task)
           JOIN tasks t ON t.job_id = j.id AND t.state IN ('queued', 'assigned', 'running')
                           AND t.state IN ('assigned', 'running')
           WHERE j.project_id = g.project_id AND j.state = 'running') END AS nominal_left
FROM queue_groups g
JOIN shapes s ON s.id = g.shape_id
JOIN projects p ON p.id = g.project_id;

-- Each user's running-jobs limit (`user set --max-running-jobs`) and the jobs counted against
-- it now: a running job counts one, a running array each of its active elements (as Slurm's
-- MaxJobs counts array tasks). `at_limit`: 1 when one more job would pass the limit. Admission
-- reads it (acquire_task, next_gang_job, preemption_candidates, job_quota_reason): a task that
-- adds a job (not a running job's queued replica) waits while its user is at the limit.
CREATE VIEW user_running_jobs AS
SELECT c.*, CASE WHEN c.max_running_jobs IS NULL THEN 0 ELSE c.running_jobs >= c.max_running_jobs END AS at_limit
FROM (SELECT u.id AS user_id, u.name, u.max_running_jobs,
             (SELECT total(CASE WHEN r.array_size IS NULL THEN 1 ELSE (  -- an array: its active elements
                  SELECT count(*) FROM tasks t WHERE t.job_id = r.id AND t.state IN ('queued', 'assigned', 'running')
                                                 AND t.state IN ('assigned', 'running')) END)
              FROM jobs r WHERE r.user_id = u.id AND r.state = 'running') AS running_jobs
      FROM users u) c;
