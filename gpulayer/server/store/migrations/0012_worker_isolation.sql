-- Version 12: each worker says how it isolates its tasks (issue 24): `isolation`, the register
-- call's JSON object ({"sandbox": "bwrap"|"none", "user", "root_tasks", "limits", "warning"}),
-- '{}' for a worker that did not say (an older agent).
ALTER TABLE workers ADD COLUMN isolation TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(isolation));
