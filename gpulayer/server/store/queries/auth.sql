-- The queries of security/auth.py: a session or minted token, by its hash.

-- name: worker_by_session --
-- Authenticate a worker session token by its hash.
SELECT id, name, state, gone_reason, session_hash, labels, token_labels, advertise_address, token_jti
FROM workers WHERE session_hash = :session_hash;

-- name: token_by_hash --
-- Authenticate a minted token by its hash.
SELECT jti, kind, name, labels, token_hash, expires_at, revoked_at, user_id FROM tokens WHERE token_hash = :token_hash;
