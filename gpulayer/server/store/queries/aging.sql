-- The queries of scheduler/aging.py: the age boost of waiting work.

-- name: age_queued_tasks --
-- Upkeep: raise the age boost of up to :limit queued tasks that waited another :step_s seconds since
-- they became eligible (task_queue.since), one step per :step_s, to :max_aged at most: a seek of
-- task_queue_aging per step below the cap, so a round reads only the rows it raises. The task ids.
UPDATE task_queue SET aged = min(CAST(:max_aged AS INTEGER), CAST((:now - since) / :step_s AS INTEGER))
WHERE task_id IN (
    WITH RECURSIVE step(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM step WHERE k + 1 < :max_aged)
    SELECT q.task_id FROM step JOIN task_queue q ON q.aged = step.k AND q.since <= :now - (step.k + 1) * :step_s
    LIMIT :limit)
RETURNING task_id;
