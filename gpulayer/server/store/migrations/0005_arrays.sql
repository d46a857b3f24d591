-- Version 5: job arrays and dependencies (issue 16).
SELECT 1;
