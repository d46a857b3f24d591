"""The explorer behind a client token, mounted at /explorer as the control plane serves it."""
from __future__ import annotations

from pathlib import Path

import falcon.testing
import pytest
from explorer_state import CLIENT_TOKEN, NOW

from explorer import create_app
from explorer.auth import SESSION_TTL_S

COOKIE = "gpulayer_token"


@pytest.mark.parametrize("url", ["/explorer", "/explorer/", "/explorer/jobs?state=queued", "/explorer/-/workers",
                                 "/explorer/-/jobs/1", "/explorer/-/query?sql=select+1"])
def test_html_without_a_token_redirects_to_login(auth_client: falcon.testing.TestClient, url: str) -> None:
    result = auth_client.simulate_get(url)
    assert result.status_code == 303
    assert result.headers["location"].startswith("/explorer/-/login?next=%2Fexplorer")
    assert "Secure" not in result.headers.get("set-cookie", "")


@pytest.mark.parametrize("url", ["/explorer/jobs.json", "/explorer/jobs.csv", "/explorer/-/query.json?sql=select+1",
                                 "/explorer/-/query.csv?sql=select+1", "/explorer/-/queries/queued_jobs.json"])
def test_data_without_a_valid_token_is_401(auth_client: falcon.testing.TestClient, url: str) -> None:
    for headers in ({}, {"Authorization": "Bearer glc_wrong"}):
        result = auth_client.simulate_get(url, headers=headers)
        assert result.status_code == 401
        assert result.json["ok"] is False and "client token is required" in result.json["error"]
    assert auth_client.simulate_get(url, cookies={COOKIE: "glc_wrong"}).status_code == 401


def test_bearer_token_and_cookie_both_work(auth_client: falcon.testing.TestClient) -> None:
    bearer = auth_client.simulate_get("/explorer/-/query.json", params={"sql": "select 1"},
                                      headers={"Authorization": f"Bearer {CLIENT_TOKEN}"})
    assert bearer.json == {"ok": True, "columns": ["1"], "rows": [[1]], "truncated": False}
    page = auth_client.simulate_get("/explorer/-/workers", cookies={COOKIE: log_in(auth_client)})
    assert page.status_code == 200 and "gpu-a" in page.text
    assert 'action="/explorer/-/logout"' in page.text


def test_login_page_and_stylesheet_are_open(auth_client: falcon.testing.TestClient) -> None:
    login = auth_client.simulate_get("/explorer/-/login", params={"next": "/explorer/-/workers"})
    assert login.status_code == 200
    assert '<input type="hidden" name="next" value="/explorer/-/workers">' in login.text
    assert auth_client.simulate_get("/explorer/-/static/app.css").status_code == 200


def test_login_sets_an_httponly_samesite_strict_secure_cookie(auth_client: falcon.testing.TestClient) -> None:
    result = auth_client.simulate_post("/explorer/-/login",
                                       headers={"Content-Type": "application/x-www-form-urlencoded"},
                                       body=f"token={CLIENT_TOKEN}&next=%2Fexplorer%2F-%2Fworkers")
    assert result.status_code == 303 and result.headers["location"] == "/explorer/-/workers"
    cookie = result.cookies[COOKIE]
    assert cookie.value != CLIENT_TOKEN and len(cookie.value) >= 40
    assert cookie.http_only and cookie.secure and cookie.same_site == "Strict"
    assert cookie.path == "/explorer"


def test_login_refuses_a_wrong_token(auth_client: falcon.testing.TestClient) -> None:
    result = auth_client.simulate_post("/explorer/-/login", body="token=glc_wrong",
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert result.status_code == 401
    assert "not a valid client token" in result.text
    assert COOKIE not in result.cookies


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/elsewhere", "/explorer\\@evil"])
def test_login_never_redirects_outside_the_explorer(auth_client: falcon.testing.TestClient, target: str) -> None:
    result = auth_client.simulate_post("/explorer/-/login", body=f"token={CLIENT_TOKEN}&next={target}",
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert result.headers["location"] == "/explorer/"


def test_cookie_is_not_secure_on_plain_http(state: Path) -> None:
    client = falcon.testing.TestClient(create_app(str(state), auth=lambda token: token == CLIENT_TOKEN))
    result = client.simulate_post("/-/login", body=f"token={CLIENT_TOKEN}",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    cookie = result.cookies[COOKIE]
    assert not cookie.secure and cookie.http_only and cookie.path == "/"
    assert result.headers["location"] == "/"


def test_logout_forgets_the_cookie(auth_client: falcon.testing.TestClient) -> None:
    result = auth_client.simulate_post("/explorer/-/logout", cookies={COOKIE: log_in(auth_client)})
    assert result.status_code == 303 and result.headers["location"] == "/explorer/-/login"
    assert result.cookies[COOKIE].value == ""


def log_in(client: falcon.testing.TestClient, base: str = "/explorer") -> str:
    """Log in through the form; the session id the cookie carries."""
    result = client.simulate_post(f"{base}/-/login", body=f"token={CLIENT_TOKEN}",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert result.status_code == 303, result.text
    return result.cookies[COOKIE].value


def test_the_cookie_is_a_session_that_logout_revokes(auth_client: falcon.testing.TestClient) -> None:
    assert auth_client.simulate_get("/explorer/jobs.json", cookies={COOKIE: CLIENT_TOKEN}).status_code == 401
    first, second = log_in(auth_client), log_in(auth_client)
    assert first != second
    for session in (first, second):
        assert auth_client.simulate_get("/explorer/jobs.json", cookies={COOKIE: session}).status_code == 200
    auth_client.simulate_post("/explorer/-/logout", cookies={COOKIE: first})
    assert auth_client.simulate_get("/explorer/jobs.json", cookies={COOKIE: first}).status_code == 401
    assert auth_client.simulate_get("/explorer/jobs.json", cookies={COOKIE: second}).status_code == 200


def test_a_session_expires_and_dies_with_its_token(state: Path) -> None:
    now, valid = [NOW], {CLIENT_TOKEN}
    app = create_app(str(state), auth=lambda token: token in valid, clock=lambda: now[0])
    client = falcon.testing.TestClient(app)
    session = log_in(client, "")
    assert client.simulate_get("/jobs.json", cookies={COOKIE: session}).status_code == 200
    now[0] += SESSION_TTL_S + 1
    assert client.simulate_get("/jobs.json", cookies={COOKIE: session}).status_code == 401
    session = log_in(client, "")
    valid.clear()   # the client token rotated
    assert client.simulate_get("/jobs.json", cookies={COOKIE: session}).status_code == 401


@pytest.mark.parametrize(("url", "status"), [("/explorer/", 303), ("/explorer/-/login", 200),
                                             ("/explorer/jobs.json", 401),
                                             ("/explorer/-/static/app.css", 200)])
def test_every_answer_carries_the_security_headers(auth_client: falcon.testing.TestClient, url: str,
                                                    status: int) -> None:
    result = auth_client.simulate_get(url)
    assert result.status_code == status
    assert_security_headers(result)


@pytest.mark.parametrize("url", ["/", "/jobs", "/jobs.csv", "/-/query.json?sql=select+x", "/-/jobs/1", "/-/jobs/999",
                                 "/nope"])
def test_pages_and_errors_carry_the_security_headers(client: falcon.testing.TestClient, url: str) -> None:
    assert_security_headers(client.simulate_get(url))


def assert_security_headers(result: falcon.testing.Result) -> None:
    csp = result.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "style-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert result.headers["x-frame-options"] == "DENY"
    assert result.headers["x-content-type-options"] == "nosniff"
    assert result.headers["referrer-policy"] == "no-referrer"


def test_open_explorer_has_no_login(client: falcon.testing.TestClient) -> None:
    assert client.simulate_get("/-/login").status_code == 404
    assert "Log out" not in client.simulate_get("/").text
