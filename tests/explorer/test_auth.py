"""The explorer behind a client token, mounted at /explorer as the control plane serves it."""
from __future__ import annotations

from pathlib import Path

import falcon.testing
import pytest
from explorer_state import CLIENT_TOKEN

from explorer import create_app

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
    page = auth_client.simulate_get("/explorer/-/workers", cookies={COOKIE: CLIENT_TOKEN})
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
    assert cookie.value == CLIENT_TOKEN
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
    result = auth_client.simulate_post("/explorer/-/logout", cookies={COOKIE: CLIENT_TOKEN})
    assert result.status_code == 303 and result.headers["location"] == "/explorer/-/login"
    assert result.cookies[COOKIE].value == ""


def test_open_explorer_has_no_login(client: falcon.testing.TestClient) -> None:
    assert client.simulate_get("/-/login").status_code == 404
    assert "Log out" not in client.simulate_get("/").text
