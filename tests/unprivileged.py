"""Run a child process without root's power over files, as an unprivileged user would be.

As root, a test that needs permission bits to count (a file a user may not read) runs the child under
setpriv with an empty capability bounding set: still uid 0, so the interpreter and the checkout under
/root stay reachable, but without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH a mode-000 file or folder is
refused to it as to anyone. As any other user, permissions apply already: no prefix.
"""
from __future__ import annotations

import os
import shutil

import pytest


def unprivileged_prefix() -> list[str]:
    """The argv prefix that runs a command without capabilities (skips the test as root without setpriv)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("as root this needs setpriv to drop capabilities")
    return ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--"]
