-- Version 21: a webhook whose owner is gone (removed) is disabled, not deleted: `disabled` says why (the
-- outbox sets it, with a `webhook_disabled` event), and the outbox hands it nothing more.
ALTER TABLE webhooks ADD COLUMN disabled TEXT;
