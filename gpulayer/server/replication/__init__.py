"""Continuous replication of the state file with Litestream, the replica's writer lease, and restore.

The package's rooms (import each name from the module that holds it):

- `replica.py`: where to (`Replica`: a directory, or a URL Litestream
  understands) and the `litestream` binary.
- `lease.py`: the writer lease in a directory replica, `gpulayer-writer.json`,
  renewed every `FENCE_RENEW_S` (one writer per replica: a second one refuses
  to start, a restore refuses a fresh lease unless forced, and a control plane
  that finds the lease taken, or that could not renew it for `FENCE_TTL_S -
  FENCE_MARGIN_S`, stops). Every write takes a new generation, claimed by
  hard-linking it as `.gpulayer-writer.N` (`swap_lease`).
- `home.py`: `home/` in a directory replica, a 0600 copy of the home's secret
  files (server secret, credentials, secrets key, TLS) that a restore needs to
  rebuild a home that works; this home's writer id; the restored marker.
- `supervisor.py`: `Replicator`, `litestream replicate` as a supervised child
  (restarted with backoff, stopped with SIGTERM so that it syncs), which renews
  the lease, copies the home's files and measures the lag that health reads.
- `lag.py`: what the lag is read from (LTX files, Litestream's control socket).
- `restore.py`: `restore()`, a new home rebuilt from a replica.

Other replica URLs (s3://, sftp://, ...) are passed to Litestream as they are;
the lease and the home files are then the operator's (docs/operations.md), and
their lag is the time since Litestream's last sync that shipped everything,
asked of its control socket.
"""
