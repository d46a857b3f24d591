-- The queries of store/db.py: the state file itself (an empty file, the storage probe).

-- name: schema_objects --
-- How many tables, indexes and views a file holds (an empty file gets schema.sql).
SELECT count(*) AS n FROM sqlite_schema;

-- name: storage_probe --
-- /v1/health after a full disk: an event row of 16 kB, so it needs new pages in the
-- file; storage_probe_undo removes it in the same transaction, whose COMMIT still writes pages.
INSERT INTO events (at, kind, data)
VALUES (0, 'storage_probe', json_object('pad', printf('%.*c', 16384, 'x'))) RETURNING seq;

-- name: storage_probe_undo --
-- The other half of storage_probe.
DELETE FROM events WHERE kind = 'storage_probe' AND at = 0 RETURNING seq;
