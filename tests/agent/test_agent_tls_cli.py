"""CA pinning by fingerprint, URL checks, and `python -m agent` messages."""

import glob
import hashlib
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.errors import AgentError
from agent.link.tls import normalize_fingerprint, pin_ca
from agent.link.transport import check_url


def some_pem():
    for path in sorted(glob.glob("/etc/ssl/certs/*.pem")):
        text = open(path).read()
        if "BEGIN CERTIFICATE" in text:
            return text
    pytest.skip("no PEM certificate on this host")


@pytest.fixture
def ca_server():
    pem = some_pem()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pem.encode() if self.path == "/v1/ca.pem" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() waits out one poll
    der = ssl.PEM_cert_to_DER_cert(pem[: pem.index("-----END CERTIFICATE-----") + 25])
    yield f"http://127.0.0.1:{server.server_address[1]}", hashlib.sha256(der).hexdigest(), pem
    server.shutdown()


def test_pin_ca_accepts_the_matching_ca_and_saves_it(ca_server, tmp_path):
    url, fingerprint, pem = ca_server
    colons = ":".join(fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()
    path = pin_ca(url, "sha256:" + colons, tmp_path)
    assert open(path).read() == pem
    assert pin_ca("http://127.0.0.1:9", "sha256:" + fingerprint, tmp_path) == path  # pinned: no second fetch


def test_pin_ca_refuses_another_ca(ca_server, tmp_path):
    url, _, _ = ca_server
    with pytest.raises(AgentError, match="refusing to trust it"):
        pin_ca(url, "sha256:" + "0" * 64, tmp_path)
    assert not (tmp_path / "ca.pem").exists()


def test_fingerprint_format():
    with pytest.raises(AgentError):
        normalize_fingerprint("sha256:abc")


@pytest.mark.parametrize("url", ["http://localhost:8470", "http://127.0.0.1:1", "http://[::1]:2", "https://gpu.example:8470/"])
def test_urls_allowed(url):
    assert not check_url(url, insecure=False).endswith("/")


def test_plain_http_to_a_remote_host_needs_insecure():
    with pytest.raises(AgentError, match="refusing plain HTTP to cp.example: use https:// or --insecure"):
        check_url("http://cp.example:8470", insecure=False)
    assert check_url("http://cp.example:8470/v1", insecure=True) == "http://cp.example:8470"


def run_agent(*args, env=None):
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=60,
                          env=env or {"PATH": "/usr/bin:/bin"}, cwd=str(__import__("pathlib").Path(__file__).parents[2]))


def test_module_entry_point_messages():
    missing = run_agent("--url", "https://cp.example:8470")
    assert missing.returncode == 2 and missing.stderr.strip() == "gpulayer worker: no join token: pass --token-file or set GPULAYER_JOIN_TOKEN"
    plain = run_agent("--url", "http://cp.example:8470", env={"PATH": "/usr/bin:/bin", "GPULAYER_JOIN_TOKEN": "glj_x"})
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines()[-1] == "gpulayer worker: refusing plain HTTP to cp.example: use https:// or --insecure"
    assert "Traceback" not in plain.stderr and "glj_x" not in plain.stderr


def test_sigterm_to_the_agent_process_stops_tasks_and_deregisters(plane, tmp_path):
    import os
    import signal
    import time

    from fake_control_plane import JOIN, SESSION, assignment

    plane.submit(assignment(60, [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]))
    env = dict(os.environ, GPULAYER_JOIN_TOKEN=JOIN, GPULAYER_ARTIFACT_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "agent", "--url", plane.url, "--state-dir", str(tmp_path / "state"),
                             "--gpus", "0"], env=env, cwd=str(__import__("pathlib").Path(__file__).parents[2]),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while "up" not in plane.log_texts(60) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert plane.finishes[60]["outcome"] == "cancelled"
    assert plane.deregistered
    assert JOIN not in err and SESSION not in err
    assert "task_started task_id=60" in err and "worker_deregistered" in err


def test_agent_imports_nothing_of_the_control_plane():
    """Nor of the client: of gpulayer, the protocol, the relay link and the process runtime alone (the package's
    __init__ loads the client lazily)."""
    shared = ("gpulayer.protocol", "gpulayer.relaylink", "gpulayer.proc")
    code = ("import sys, agent.worker, agent.__main__; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'falcon', 'apsw', 'waitress', 'jinja2', 'cheroot'} | "
            f"{{m for m in sys.modules if m.startswith('gpulayer.') and not m.startswith({shared!r})}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.stdout.strip() == "[]", out.stderr
