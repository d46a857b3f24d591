"""The README's plain-`requests` snippet, run as written against a real TLS control plane.

Where REQUESTS_CA_BUNDLE is set (corporate machines, many CI images) requests
lets it override `Session.verify`; the snippet must still verify with the CA
it names, so the test sets REQUESTS_CA_BUNDLE to an unrelated CA.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.testing import ControlPlaneProcess, clean_env

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _snippet() -> str:
    section = README[README.index("## From scripts, with plain `requests`"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("readme"), tls=True) as plane:
        yield plane


def test_readme_requests_snippet_runs_as_written(plane, tmp_path):
    from gpulayer.server.security.certs import make_ca
    other_ca, _ = make_ca(tmp_path / "unrelated")
    code = _snippet()
    assert 'URL, TOKEN, CA = "https://cp.internal:8470", "glc_...", "ca.pem"' in code
    code = code.replace('"https://cp.internal:8470"', repr(plane.url)).replace(
        '"glc_..."', repr(plane.tokens["client_token"])).replace('"ca.pem"', repr(str(plane.ca_file)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=clean_env(REQUESTS_CA_BUNDLE=str(other_ca)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    state, lines = done.stdout.splitlines()
    assert state == "queued" and lines == "[]"
