-- Version 24: fair share written once (issue 37). The decayed usage that ranks queued work was
-- written out in every claim (acquire_one, acquire_task, next_gang_job) and again in Python; it is now
-- two views the claims join, user_fair_share and project_fair_share, decayed to claim_clock's `now`,
-- a one-row table the claim transaction writes before it reads (a view takes no parameter).
CREATE TABLE claim_clock (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    now  REAL NOT NULL
) STRICT;
INSERT INTO claim_clock (id, now) VALUES (1, 0);

-- Fair share, written once: each user's usage in each project decayed by the half-life to the
-- claim's time (claim_clock), plus `running`; and each project's, the sum of its users' over the
-- project's share (its weight, else its GPU quota, else 1; 0 with no usage). The claims
-- (acquire_one, acquire_task) and gang placement (next_gang_job) rank work of the same priority
-- by the project's, then the user's (none, no usage row, first), lowest first.
CREATE VIEW user_fair_share AS
SELECT fs.project_id, fs.user_id,
       fs.usage * pow(0.5, (c.now - fs.updated_at) / st.fairshare_half_life_s) + fs.running AS usage
FROM fairshare fs, claim_clock c, scheduler_settings st;

CREATE VIEW project_fair_share AS
SELECT p.id AS project_id,
       (SELECT coalesce(sum(u.usage), 0) FROM user_fair_share u WHERE u.project_id = p.id)
       / coalesce(p.weight, nullif(p.gpu_quota, 0), 1) AS usage
FROM projects p;
