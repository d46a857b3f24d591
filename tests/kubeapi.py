"""A Kubernetes API double: the core/v1 Pods and Secrets of namespaces, over real HTTP, in the real API's JSON.

No package ships a Kubernetes API server and no cluster runs here, so the Kubernetes provisioner
(tests/unit/test_kubernetes_provisioner.py) and the control plane pod's init step (tests/kubernetes/) talk
to this: lightkube sends its real requests (POST/GET/DELETE under /api/v1/namespaces/NS/pods|secrets,
`labelSelector`, `tailLines`), and the double answers as the API server does: the object with `uid`,
`resourceVersion` and `creationTimestamp`, a `PodList`, a Secret's `stringData` turned into base64 `data`,
and every refusal as a `Status` object (404 NotFound, 409 AlreadyExists, 422 Invalid when the object fails
the Kubernetes OpenAPI schema of kubernetes-validate, 401 without the bearer token). `refuse()` makes the
next requests of a kind fail as a cluster would (403 Forbidden "exceeded quota", 403 RBAC, 409, 422).

    with KubeAPI(token="t") as kube:
        kube.kubeconfig(path)        # a kubeconfig file that points lightkube at it
        kube.objects["Pod"]          # {(namespace, name): the object as stored}

What it does not do: scheduling, kubelets (a Pod stays `Pending` until a test calls `set_phase`), RBAC
rules, watches, quota accounting (a refusal is what the test asks for).
"""
from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_PATH = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|secrets)(?:/(?P<name>[^/]+)(?P<log>/log)?)?\Z")
KINDS = {"pods": "Pod", "secrets": "Secret"}


def status(code: int, reason: str, message: str, **details) -> dict:
    """A metav1.Status, as the API server answers every refusal."""
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
           "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


class KubeAPI:
    """The double, served on 127.0.0.1 (or `host`) on a free port in a thread; a context manager."""

    def __init__(self, token: str = "test-token", host: str = "127.0.0.1", validate: bool = True):
        self.token = token
        self.validate = validate
        self.objects: dict[str, dict] = {"Pod": {}, "Secret": {}}
        self.requests: list[tuple[str, str]] = []      # (method, path) in order
        self.refusals: list[dict] = []
        self._version = 0
        self._lock = threading.Lock()
        self.logs: dict[str, str] = {}                 # Pod name: its log
        self.server = ThreadingHTTPServer((host, 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="kubeapi", daemon=True)

    def __enter__(self) -> "KubeAPI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "gpulayer", token: str | None = None) -> Path:
        """Write a kubeconfig that points at the double (with `token`, default the right one)."""
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "double",
                  "clusters": [{"name": "double", "cluster": {"server": self.url}}],
                  "users": [{"name": "gpulayer", "user": {"token": self.token if token is None else token}}],
                  "contexts": [{"name": "double", "context": {"cluster": "double", "user": "gpulayer",
                                                              "namespace": namespace}}]}
        Path(path).write_text(json.dumps(config))
        return Path(path)

    def refuse(self, method: str, kind: str, code: int, reason: str, message: str, times: int = 1_000_000) -> None:
        """The next `times` requests `method` on `kind` ("Pod"/"Secret") answer this Status."""
        self.refusals.append({"method": method, "kind": kind, "times": times,
                              "status": status(code, reason, message)})

    def set_phase(self, name: str, phase: str, namespace: str = "gpulayer", **status_fields) -> None:
        """What a kubelet would report: the Pod's phase (and any other status fields)."""
        with self._lock:
            pod = self.objects["Pod"][(namespace, name)]
            pod["status"] = {**pod.get("status", {}), "phase": phase, **status_fields}

    def pods(self, namespace: str = "gpulayer") -> dict[str, dict]:
        return {n: o for (ns, n), o in self.objects["Pod"].items() if ns == namespace}

    def secrets(self, namespace: str = "gpulayer") -> dict[str, dict]:
        return {n: o for (ns, n), o in self.objects["Secret"].items() if ns == namespace}

    # -- the API ------------------------------------------------------------------------------------------

    def _refusal(self, method: str, kind: str) -> dict | None:
        for r in self.refusals:
            if r["method"] == method and r["kind"] == kind and r["times"] > 0:
                r["times"] -= 1
                return r["status"]
        return None

    def _create(self, kind: str, ns: str, body: dict) -> tuple[int, dict]:
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        if meta.get("namespace", ns) != ns:
            return 400, status(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
        if body.get("kind") != kind or body.get("apiVersion") != "v1":
            return 400, status(400, "BadRequest", f"expected kind {kind} apiVersion v1")
        if self.validate:
            import kubernetes_validate
            try:
                kubernetes_validate.validate(body, "1.37.0", strict=True)
            except kubernetes_validate.ValidationError as exc:
                return 422, status(422, "Invalid", f'{kind} "{name}" is invalid: {exc.message}')
        if (ns, name) in self.objects[kind]:
            return 409, status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists',
                               name=name, kind=kind.lower() + "s")
        self._version += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"] = {**meta, "namespace": ns, "uid": str(uuid.uuid4()), "resourceVersion": str(self._version),
                              "creationTimestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        if kind == "Secret" and "stringData" in stored:
            data = stored.setdefault("data", {})
            for key, value in stored.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        if kind == "Pod":
            stored["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        self.objects[kind][(ns, name)] = stored
        return 201, stored

    def _list(self, kind: str, ns: str, query: dict) -> dict:
        wanted = {}
        for term in filter(None, (query.get("labelSelector") or [""])[0].split(",")):
            key, _, value = term.partition("=")
            wanted[key] = value
        items = [o for (n, _), o in sorted(self.objects[kind].items()) if n == ns
                 and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                "items": items}

    def answer(self, method: str, target: str, headers, body: bytes) -> tuple[int, dict | str]:
        """(HTTP status, JSON object or log text) for one request."""
        url = urlsplit(target)
        self.requests.append((method, url.path))
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        m = _PATH.match(url.path)
        if not m:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        kind, ns, name = KINDS[m["plural"]], m["ns"], m["name"]
        refused = self._refusal(method, kind)
        if refused is not None:
            return refused["code"], refused
        with self._lock:
            if method == "POST" and not name:
                return self._create(kind, ns, json.loads(body or b"{}"))
            if method == "GET" and not name:
                return 200, self._list(kind, ns, parse_qs(url.query))
            found = self.objects[kind].get((ns, name))
            if found is None or method not in ("GET", "DELETE"):
                if method not in ("GET", "DELETE"):
                    return 405, status(405, "MethodNotAllowed", f"{method} is not supported here")
                return 404, status(404, "NotFound", f'{m["plural"]} "{name}" not found', name=name, kind=m["plural"])
            if m["log"]:
                lines = self.logs.get(name, "").splitlines(keepends=True)
                tail = int((parse_qs(url.query).get("tailLines") or ["0"])[0]) or len(lines)
                return 200, "".join(lines[-tail:])
            if method == "DELETE":
                del self.objects[kind][(ns, name)]
            return 200, found

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True   # headers and body are two writes: no 40 ms delayed-ACK stall

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                code, out = api.answer(self.command, self.path, self.headers, self.rfile.read(length))
                data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(out, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

            def log_message(self, *args) -> None:
                pass

        return Handler
