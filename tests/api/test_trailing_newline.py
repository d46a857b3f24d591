"""A trailing newline passes no pattern that validates input (issue 22 item 8, docs/security.md).

`POST /v1/users {"name": "admin\\n"}` answered 201 and `user list` showed two `admin` rows: the name's
pattern ended in `$`, which also matches before a final newline. Every field a pattern validates, on
every route that takes it, is sent with a trailing "\\n": 400, and nothing changed.
"""
from __future__ import annotations

from urllib.parse import quote

import pytest

DIGEST = "sha256:" + "0" * 64
NL = "\n"

# (what, method, path, JSON body): the field under test ends in a newline
CASES = [
    ("user name", "POST", "/v1/users", {"name": "admin" + NL}),
    ("new user name", "POST", "/v1/users", {"name": "newbie" + NL}),
    ("a user's project", "POST", "/v1/users", {"name": "newbie", "projects": [{"project": "default" + NL}]}),
    ("project name", "POST", "/v1/projects", {"name": "default" + NL}),
    ("new project name", "POST", "/v1/projects", {"name": "fresh" + NL}),
    ("job project", "POST", "/v1/jobs", {"command": ["true"], "project": "default" + NL}),
    ("job label key", "POST", "/v1/jobs", {"command": ["true"], "labels": {"team" + NL: "a"}}),
    ("job env name", "POST", "/v1/jobs", {"command": ["true"], "env": {"HOME" + NL: "x"}}),
    ("job secret name", "POST", "/v1/jobs", {"command": ["true"], "secrets": ["HF" + NL]}),
    ("job source digest", "POST", "/v1/jobs", {"command": ["true"], "source": DIGEST + NL}),
    ("job input digest", "POST", "/v1/jobs", {"command": ["true"], "inputs": {"in.bin": DIGEST + NL}}),
    ("job array range", "POST", "/v1/jobs", {"command": ["true"], "array": "0-3" + NL}),
    ("token label key", "POST", "/v1/tokens", {"name": "j", "labels": {"pool" + NL: "a"}}),
    ("secret name", "PUT", "/v1/secrets/" + quote("HF" + NL), {"value": "v"}),
    ("secret label key", "PUT", "/v1/secrets/HF", {"value": "v", "labels": {"k" + NL: "v"}}),
    ("artifact digest", "PUT", "/v1/artifacts/" + quote(DIGEST + NL), None),
    ("usage label key", "GET", "/v1/usage?by=" + quote("label:team" + NL), None),
]


def _snapshot(api, client_h) -> tuple:
    """What the routes above could change: users, projects, jobs, tokens, secrets."""
    def get(path, key):
        r = api.simulate_get(path, headers=client_h)
        assert r.status_code == 200, r.text
        return r.json[key]
    return (get("/v1/users", "users"), get("/v1/projects", "projects"), get("/v1/jobs?all=true", "jobs"),
            get("/v1/tokens", "tokens"), get("/v1/secrets", "secrets"))


@pytest.mark.parametrize("what, method, path, body", CASES, ids=[c[0] for c in CASES])
def test_a_trailing_newline_is_400_and_changes_nothing(api, client_h, what, method, path, body):
    before = _snapshot(api, client_h)
    if body is None and method == "PUT":
        r = api.simulate_request(method, path, headers=client_h, body=b"x")
    else:
        r = api.simulate_request(method, path, headers=client_h, json=body)
    assert r.status_code == 400, (what, r.status_code, r.text)
    assert r.json["error"]["code"] and r.json["error"]["message"]
    assert _snapshot(api, client_h) == before
