-- Version 4: teams (users, projects, memberships, ownership, quotas, fair share,
-- preemption, the usage ledger). Filled in by the teams work (issue 15).
SELECT 1;
