"""serve(): a real process serving the explorer over plain HTTP, printing its URL."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import requests

from gpulayer.testing import CLI, clean_env, run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_serve_prints_its_url_and_answers(state: Path) -> None:
    code = f"from explorer import serve; serve({str(state)!r}, port=0)"
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("GPUlayer explorer: http://127.0.0.1:")
        url = line.split()[2]
        with urllib.request.urlopen(url + "-/query.json?sql=select+count(*)+from+jobs", timeout=10) as answer:
            assert json.load(answer) == {"ok": True, "columns": ["count(*)"], "rows": [[9]], "truncated": False}
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200 and b"<h2>Jobs now" in answer.read()
        with urllib.request.urlopen(url + "-/tables", timeout=10) as answer:
            assert answer.status == 200 and b"worker_load" in answer.read()
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
def test_explore_refuses_an_open_non_loopback_address(state: Path, host: str) -> None:
    done = run_cli("explore", "--state", str(state), "--host", host, "--port", "0", timeout=60)
    assert done.returncode == 2, done
    assert f"refusing to serve the explorer without a token on {host}" in done.stderr
    assert "--token-required" in done.stderr and "Traceback" not in done.stderr


def test_token_required_needs_an_initialised_home(state: Path, tmp_path: Path) -> None:
    done = run_cli("explore", "--home", str(tmp_path / "nohome"), "--state", str(state), "--host", "0.0.0.0",
                   "--port", "0", "--token-required", timeout=60)
    assert done.returncode != 0 and "not initialised" in done.stderr and "Traceback" not in done.stderr


def test_explore_on_all_addresses_behind_the_client_token(state: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = json.loads(run_cli("server", "init", "--home", str(home), "--json", timeout=60).stdout)["client_token"]
    argv = [*CLI, "explore", "--home", str(home), "--state", str(state), "--host", "0.0.0.0", "--port", "0",
            "--token-required"]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=clean_env())
    try:
        port = process.stdout.readline().split()[2].rsplit(":", 1)[1].rstrip("/")
        url = f"http://127.0.0.1:{port}/jobs.json"
        assert requests.get(url, timeout=10).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer glc_wrong"}, timeout=10).status_code == 401
        answer = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["ok"] is True
        login = requests.post(f"http://127.0.0.1:{port}/-/login", data={"token": token}, allow_redirects=False,
                              timeout=10)
        assert login.status_code == 303 and token not in login.headers["set-cookie"]
    finally:
        process.terminate()
        process.wait(10)


def test_explore_on_an_address_it_cannot_take_is_a_clear_error(state: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_cli("server", "init", "--home", str(home), "--json", timeout=60)
    done = run_cli("explore", "--home", str(home), "--state", str(state), "--host", "nosuch.invalid",
                   "--token-required", timeout=60)
    assert done.returncode == 2 and "cannot listen on nosuch.invalid" in done.stderr
    assert "Traceback" not in done.stderr
