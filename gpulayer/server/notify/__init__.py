"""Notifications (issue 28, docs/notifications.md): webhooks and mail delivered from the event log as an
outbox, and alerts on read-only SQL queries.

`names.py` maps the events table's kinds to public names; `targets.py` adds, lists and removes webhooks
and alerts (transactions, rights); `signing.py` is Standard Webhooks; `send.py` talks HTTP and SMTP;
`outbox.py` is the delivery loop (a thread, a bounded pool); `alerts.py` runs alert queries.
"""
