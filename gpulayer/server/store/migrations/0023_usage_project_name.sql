-- Version 23: a removed project's usage keeps its name, and its id is never given to a new project.
-- `project remove` deleted the project's row, so the ledger's rows of it read `#2` in `gpulayer usage --by
-- project`, and the next project added took the same id, its jobs, runs and fair share with it. The removal
-- now writes the project's name into its usage rows (`project_name`, NULL while the project exists), which
-- reports use; a new project's id is past every project id jobs, usage and fair share name
-- (queries/teams.sql, insert_project), which this index answers at once.
ALTER TABLE usage ADD COLUMN project_name TEXT;
CREATE INDEX usage_project ON usage (project_id);
