"""Structured agent logs: one event name per line, then ``key=value`` pairs.

Example: ``task_started task_id=3 pid=4711``. Never pass a token here.
"""

import logging
import sys

LOGGER = logging.getLogger("gpulayer.agent")


def _format_value(value: object) -> str:
    text = str(value)
    if not text or any(ch.isspace() for ch in text) or '"' in text or "=" in text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_event(event: str, /, **fields: object) -> str:
    """Render one event line: ``name k=v k2="with space"`` (None values skipped)."""
    parts = [event]
    parts.extend(f"{key}={_format_value(value)}" for key, value in fields.items() if value is not None)
    return " ".join(parts)


def log_event(event: str, /, level: int = logging.INFO, **fields: object) -> None:
    """Log one structured event line at ``level`` (formatted only when that level is logged: a task's events are
    on the per-task hot path)."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, format_event(event, **fields))


def configure_logging(level: int = logging.INFO) -> None:
    """Send agent events to stderr with a timestamp, unless logging is already set up."""
    if LOGGER.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
