"""The explorer served for real on a loopback port, and a tab of Debian's headless chromium (driven by
playwright's Python API, never `playwright install`): what the browser tests share."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import waitress

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = Path(__file__).resolve().parents[1] / "output"  # screenshots, kept by CI as artifacts


def executable() -> str | None:
    """Debian's chromium, or None when it is not installed."""
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` (WSGI) on a free loopback port until the block ends; yields its http://127.0.0.1:PORT."""
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.close()
        thread.join(5)


@contextmanager
def behind_token(state: Path) -> Iterator[str]:
    """The explorer over `state`, behind explorer_state's client token at /explorer/ as the control plane mounts it,
    on a free loopback port, its clock at NOW; yields the explorer's root URL (no trailing slash)."""
    from explorer_state import CLIENT_TOKEN, NOW

    from explorer import create_app
    app = create_app(str(state), auth=lambda token: token == CLIENT_TOKEN, base_path="/explorer", clock=lambda: NOW)
    with serving(app) as url:
        yield f"{url}/explorer"


@contextmanager
def tab(sync_api: Any) -> Iterator[Any]:
    """A 1400x900 tab of a fresh headless chromium, 15 s timeouts."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()
