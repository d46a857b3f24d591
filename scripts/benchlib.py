"""Shared helpers of the benchmark scripts: percentiles, tables, machine facts, a real server.

`Server` is gpulayer.testing's ControlPlaneProcess (`gpulayer server start` as a
subprocess on a free loopback port, a temporary home, plain HTTP or TLS) with
--synchronous set. Nothing here imports the server into the benchmark process.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpulayer.testing import ControlPlaneProcess  # noqa: E402

PROTOCOL_HEADER = {"X-GpuLayer-Protocol": "1"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- numbers -----------------------------------------------------------------

def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no values."""
    data = sorted(values)
    if not data:
        return float("nan")
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary_ms(seconds) -> dict:
    """{n, p50, p90, p99, max} in milliseconds of a list of durations in seconds."""
    vals = list(seconds)
    return {"n": len(vals), "p50_ms": round(percentile(vals, 50) * 1e3, 3),
            "p90_ms": round(percentile(vals, 90) * 1e3, 3), "p99_ms": round(percentile(vals, 99) * 1e3, 3),
            "max_ms": round(max(vals) * 1e3, 3) if vals else float("nan")}


def median(values) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


# -- output ------------------------------------------------------------------

def table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain fixed-width table of dict rows."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def emit(result: dict, as_json: bool, text: str) -> None:
    """Print the JSON result or the human text."""
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(text)


def machine() -> dict:
    """What the figures were measured on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import apsw
    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu_model": model,
            "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(), "apsw": apsw.apsw_version(),
            "kernel": platform.release(), "loadavg_at_start": os.getloadavg()[0]}


def machine_line(info: dict | None = None) -> str:
    info = info or machine()
    return (f"machine: {info['affinity']} cores ({info['cpu_model']}), Python {info['python']}, "
            f"SQLite {info['sqlite']}, load average at start {info['loadavg_at_start']:.2f}")


# -- processes ---------------------------------------------------------------

def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS) in MiB."""
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:")) / 1024


def print_result(result: dict, as_json: bool) -> None:
    """One JSON line, or `key  value` lines."""
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Server(ControlPlaneProcess):
    """A real control plane subprocess with a temporary home (gpulayer.testing); use as a context manager."""

    def __init__(self, *, tls: bool = False, synchronous: str = "normal", extra_args: list[str] = ()):
        super().__init__(tls=tls, args=["--synchronous", synchronous, *extra_args])

    def client_headers(self) -> dict:
        return self.headers()


def session(url_verify=True):
    """A keep-alive requests.Session."""
    import requests
    s = requests.Session()
    s.trust_env = False  # else REQUESTS_CA_BUNDLE overrides s.verify, and proxies are looked up per request
    s.verify = url_verify
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=4)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


def register_worker(s, url: str, join_token: str, name: str, slots: int = 1) -> dict:
    """Register a simulated worker; returns the register answer (worker_id, session_token, ...)."""
    r = s.post(url + "/v1/workers/register",
               json={"name": name, "labels": {}, "resources": {"cpus": 64, "gpus": 0, "memory_mb": 1 << 20},
                     "version": "bench", "slots": slots},
               headers={**PROTOCOL_HEADER, "Authorization": f"Bearer {join_token}"}, timeout=30)
    r.raise_for_status()
    return r.json()


class _Answer:
    """What a lean POST returns: the status and the JSON body, as requests would give them."""

    __slots__ = ("status_code", "_body")

    def __init__(self, status_code: int, body: bytes):
        self.status_code, self._body = status_code, body

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self._body[:200]!r}")

    def json(self):
        return json.loads(self._body)


class LeanSession:
    """A keep-alive http.client connection with requests' `post(url, json=, headers=)` shape.

    The load generator shares the two cores with the server: requests costs
    several times the client CPU of http.client per call, so the simulated
    workers use this to leave the CPU to the server they measure.
    """

    def __init__(self, base_url: str, verify=True):
        import http.client
        import ssl
        from urllib.parse import urlsplit
        parts = urlsplit(base_url)
        self.base = base_url
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            self._conn = http.client.HTTPSConnection(parts.hostname, parts.port, context=ctx, timeout=60)
        else:
            self._conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def post(self, url: str, json=None, headers=None, timeout=None) -> _Answer:
        body = _json_bytes(json)
        self._conn.request("POST", url[len(self.base):], body=body,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = self._conn.getresponse()
        return _Answer(response.status, response.read())


def _json_bytes(value) -> bytes:
    return json.dumps(value).encode()
