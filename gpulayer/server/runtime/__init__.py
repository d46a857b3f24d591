"""The control plane's runtime state: what it holds in memory between requests, beside the transactions.

The rule: state here dies with the process and is never the source of truth. Each piece is either a
cache of what the state file says or a buffer of what it will say, rebuilt or lost harmlessly after a
restart: lease renewals and GPU samples noted until upkeep flushes them (renewals.py, gpu_samples.py;
a restart loses at most one tick, which the grace after a restart covers), the heartbeat cadence scaled
with the fleet (cadence.py), array jobs' element pace (pace.py), parked log followers (follow.py), the
workers whose relay link a client waits for and the relay's and ingress's counters (relay_wants.py,
ingress_counters.py), the cascade steps still to run (cascades.py: re-read from the state file at
start), and the latest start-time forecast (estimates.py: made anew at the first upkeep tick). Nothing
here writes the state file but through what the scheduler hands it (the cascades' one writer callable);
the pure `fn(conn, ..., now)` transactions are server/scheduler/'s, and the Scheduler facade
(scheduler/facade.py) holds one of each of these.
"""
