"""`gpulayer up` takes the notification, telemetry, policy, read-deadline and upload-quota options of
`server start` and passes them to its control plane: a real `up --no-worker` in a temporary home, a webhook receiver on loopback and a real
SMTP server (aiosmtpd) in this process. (Their help and usage errors: tests/client/test_cli_usage.py.)
"""

from __future__ import annotations

import subprocess

from aiosmtpd.controller import Controller

from gpulayer.testing import CLI, clean_env, free_port, run_cli, stop_process, wait_for
from receivers import Mailbox, Receiver


def test_up_passes_the_notification_options_to_its_control_plane(tmp_path):
    mailbox = Mailbox()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    smtp.start()
    receiver = Receiver()
    home, log = tmp_path / "home", tmp_path / "up.log"
    up = subprocess.Popen(
        [*CLI, "up", "--no-worker", "--verbose", "--host", "127.0.0.1", "--port", str(free_port()),
         "--allow-private-webhooks", "--smtp-url", f"smtp://127.0.0.1:{smtp.port}", "--smtp-from", "up@example.org",
         "--gpu-sample-retention", "3d", "--webhook-concurrency", "3", "--webhook-retry-base", "2", "--webhook-retry-for", "1h",
         "--preempt-grace", "7", "--max-grace", "90", "--max-queued-elements", "500", "--priority-class", "urgent=50",
         "--fairshare-half-life", "2d", "--checkpoint-keep", "5", "--read-timeout", "4", "--upload-quota-mb", "1",
         "--project-upload-quota-mb", "2", "--unnamed-retention", "1h", "--estimate-interval", "45",
         "--estimate-max-jobs", "50", "--estimate-horizon", "2d"],
        env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"), stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: up.poll() is not None or "gpulayer join" in log.read_text(), 60, "`up` to print its join line")
        assert up.poll() is None, log.read_text()
        settings = next(line for line in log.read_text().splitlines() if "server_settings" in line)
        for expected in ("gpu_sample_retention_s=259200", "allow_private_webhooks=true", f"smtp=smtp://127.0.0.1:{smtp.port}",
                         "smtp_from=up@example.org", "webhook_concurrency=3", "webhook_retry_base_s=2", "webhook_retry_for_s=3600",
                         "preempt_grace_s=7", "max_grace_s=90", "max_queued_elements=500", "fairshare_half_life_s=172800",
                         "checkpoint_keep=5", "read_timeout_s=4", "upload_quota_mb=1", "project_upload_quota_mb=2",
                         "unnamed_retention_s=3600", "estimate_interval_s=45", "estimate_max_jobs=50",
                         "estimate_horizon_s=172800"):
            assert expected in settings, settings
        env = {"GPULAYER_HOME": str(home)}
        # A loopback webhook is accepted (--allow-private-webhooks) and a mailbox too (--smtp-url): both delivered.
        hook = run_cli("webhook", "add", receiver.url, "--events", "job.submitted", "--json", env=env)
        assert hook.returncode == 0, hook.stderr
        from gpulayer.client.api import connect
        connect(home=home).add_webhook(email="ops@example.org", events=["job.submitted"])
        submitted = run_cli("submit", "--name", "told", "--priority", "urgent", "--", "true", env=env)
        assert submitted.returncode == 0, submitted.stderr
        wait_for(lambda: receiver.types() == ["job.submitted"], 60, "the webhook's delivery")
        wait_for(lambda: mailbox.messages, 60, "the mail")
        to, text = mailbox.messages[0]
        assert to == ["ops@example.org"] and "From: up@example.org" in text and "(told) submitted" in text
    finally:
        stop_process(up)
        receiver.close()
        smtp.stop()
