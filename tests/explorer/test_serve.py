"""serve(): a real process serving the explorer over plain HTTP, printing its URL."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

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
            assert answer.status == 200 and b"worker_load" in answer.read()
    finally:
        process.terminate()
        process.wait(10)
