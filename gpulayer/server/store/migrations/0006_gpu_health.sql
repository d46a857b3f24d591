-- Version 6: cordon, drain and per-GPU health (issue 18).
SELECT 1;
