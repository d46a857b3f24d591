-- The queries of scheduler/tokens.py: minted tokens.

-- name: insert_token --
-- A minted token (only its hash).
INSERT INTO tokens (jti, kind, name, labels, token_hash, created_at, expires_at, source, user_id)
VALUES (:jti, :kind, :name, :labels, :token_hash, :now, :expires_at, :source, :user_id);

-- name: list_tokens --
-- Minted tokens, never their hashes, in the order they were minted (`n`, the page cursor): all, or the
-- client tokens of :user_id; after :after, at most :limit (-1: all).
SELECT t.rowid AS n, t.jti, t.kind, t.name, t.labels, t.created_at, t.expires_at, t.revoked_at, t.source,
       u.name AS user
FROM tokens t LEFT JOIN users u ON u.id = t.user_id
WHERE (:user_id IS NULL OR t.user_id = :user_id) AND t.rowid > :after
ORDER BY t.rowid LIMIT :limit;

-- name: get_token --
-- One token, without its hash.
SELECT t.jti, t.kind, t.name, t.labels, t.created_at, t.expires_at, t.revoked_at, t.user_id, u.name AS user
FROM tokens t LEFT JOIN users u ON u.id = t.user_id WHERE t.jti = :jti;
