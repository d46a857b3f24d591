"""Run a child process without root's power over files, as an unprivileged user would be.

As root, a test that needs permission bits to count (a file a user may not read) runs the child under
setpriv with an empty capability bounding set: still uid 0, so the interpreter and the checkout under
/root stay reachable, but without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH a mode-000 file or folder is
refused to it as to anyone. As any other user, permissions apply already: no prefix.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator

import pytest


def unprivileged_prefix() -> list[str]:
    """The argv prefix that runs a command without capabilities (skips the test as root without setpriv)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("as root this needs setpriv to drop capabilities")
    return ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "--"]


def as_nobody() -> list[str]:
    """The argv prefix that runs a command as the user `nobody`: another local user, without root's rights
    (skips the test unless it runs as root with setpriv)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running a command as another user needs root and setpriv")
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]


@contextlib.contextmanager
def shared_temp_folder() -> Iterator[str]:
    """A temp folder as /tmp is (root's, 1777), that `nobody` can reach (pytest's own are root's 0700)."""
    folder = tempfile.mkdtemp(prefix="gpulayer-shared-tmp-", dir="/tmp")
    os.chmod(folder, 0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
