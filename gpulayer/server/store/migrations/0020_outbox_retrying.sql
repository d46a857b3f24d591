-- Version 20: the outbox's look at each webhook's delivery being retried (due_webhooks, every tick) reads
-- an index of the retrying rows, not every delivery the webhook kept.
CREATE INDEX webhook_deliveries_retrying ON webhook_deliveries (webhook_id) WHERE status = 'retrying';
