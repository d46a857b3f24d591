-- Version 28: start-time estimates (issue 38). The latest forecast's answer for each waiting job it
-- estimated (scheduler/forecast.py: the placement rules replayed forward on a copy of this file),
-- rewritten whole after each forecast, for readers of SQL (the explorer's queue, `gpulayer sql`).
CREATE TABLE estimates (
    job_id       INTEGER PRIMARY KEY,
    start_at     REAL,                -- when it is expected to start; NULL: it cannot be known (`reason`)
    reason       TEXT,                -- why start_at is NULL (held, after a job that has not ended, ...)
    workers      TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(workers)),  -- names it would start on
    forecast_at  REAL NOT NULL,       -- the forecast's time (the copy's `now`)
    CHECK ((start_at IS NULL) = (reason IS NOT NULL))
) STRICT;
