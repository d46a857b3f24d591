"""gl.connect() resolution: arguments, then GPULAYER_* variables, then client.json."""
import json

import pytest
import requests

import gpulayer as gl
from gpulayer.client.settings import resolve_settings
from gpulayer.client.errors import error_from_response


def _client_json(home, **data):
    (home / "client.json").write_text(json.dumps(data))


def test_nothing_configured(clean_env):
    assert resolve_settings() == gl.client.Settings(None, None, None)
    assert not gl.server_configured()
    with pytest.raises(gl.ClientError, match="no control plane configured"):
        gl.connect()


def test_client_json_is_the_last_resort(clean_env):
    _client_json(clean_env, url="https://127.0.0.1:8470", token="glc_file", ca_file="/ca.pem")
    assert resolve_settings() == gl.client.Settings("https://127.0.0.1:8470", "glc_file", "/ca.pem", True)
    assert gl.server_configured()


def test_environment_beats_client_json(clean_env, monkeypatch):
    _client_json(clean_env, url="https://127.0.0.1:8470", token="glc_file", ca_file="/ca.pem")
    monkeypatch.setenv("GPULAYER_TOKEN", "glc_env")
    assert resolve_settings().token == "glc_env"
    assert resolve_settings().ca_file == "/ca.pem"


def test_arguments_beat_environment(monkeypatch):
    monkeypatch.setenv("GPULAYER_URL", "https://env:1/")
    monkeypatch.setenv("GPULAYER_TOKEN", "glc_env")
    monkeypatch.setenv("GPULAYER_CA_FILE", "/env.pem")
    assert resolve_settings() == gl.client.Settings("https://env:1", "glc_env", "/env.pem")
    got = resolve_settings(url="https://arg:2", token="glc_arg", ca_file="/arg.pem")
    assert got == gl.client.Settings("https://arg:2", "glc_arg", "/arg.pem")


def test_client_json_token_is_never_sent_to_another_server(clean_env, monkeypatch):
    _client_json(clean_env, url="https://127.0.0.1:8470", token="glc_file")
    monkeypatch.setenv("GPULAYER_URL", "https://elsewhere:8470")
    assert resolve_settings() == gl.client.Settings("https://elsewhere:8470", None, None)


def test_home_argument_picks_the_client_file(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    _client_json(other, url="https://o:1", token="glc_o")
    assert resolve_settings(home=other).token == "glc_o"


def test_connect_sends_protocol_and_token():
    client = gl.connect(url="http://127.0.0.1:9", token="glc_x")
    assert client.session.headers["X-GpuLayer-Protocol"] == "1"
    assert client.session.headers["Authorization"] == "Bearer glc_x"


def test_unreachable_server_is_connection_failed():
    client = gl.connect(url="http://127.0.0.1:9", token="glc_x")
    with pytest.raises(gl.ConnectionFailed, match="cannot reach the control plane"):
        client.jobs()


def _response(status, body):
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(body).encode() if body is not None else b"oops"
    return response


@pytest.mark.parametrize("status,cls", [(400, gl.InvalidRequest), (401, gl.Unauthorized), (403, gl.Forbidden),
                                        (404, gl.NotFound), (409, gl.Conflict), (413, gl.InvalidRequest),
                                        (426, gl.ProtocolMismatch), (500, gl.ApiError)])
def test_errors_are_typed_and_carry_the_server_code(status, cls):
    err = error_from_response(_response(status, {"error": {"code": "some_code", "message": "Said so."}}))
    assert type(err) is cls and err.code == "some_code" and err.message == "Said so."
    assert err.status == status and str(err) == "Said so. (some_code)"


def test_non_json_error_still_has_a_message():
    err = error_from_response(_response(502, None))
    assert err.code == "http_error" and "502" in err.message


def test_unreachable_server_from_client_json_hints_at_up(clean_env):
    _client_json(clean_env, url="http://127.0.0.1:9", token="glc_file")
    with pytest.raises(gl.ConnectionFailed, match="is `gpulayer up` running"):
        gl.connect().jobs()
