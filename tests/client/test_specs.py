"""gl.job() and gl.service() shape JobSpecs as docs/protocol.md defines them."""
import pytest

import gpulayer as gl


def test_job_keeps_only_given_settings():
    spec = gl.job(["python", "train.py"], gpus=2, env={"A": 1}, labels={"pool": "a100"})
    assert spec == {"command": ["python", "train.py"], "gpus": 2, "env": {"A": "1"},
                    "labels": {"pool": "a100"}}


def test_job_splits_a_string_command_like_a_shell():
    assert gl.job("sh -c 'echo hi there'")["command"] == ["sh", "-c", "echo hi there"]


def test_retry_int_and_reasons():
    assert gl.job(["x"], retry=3)["retry"] == {"max_attempts": 3}
    assert gl.job(["x"], retry=2, retry_on=["failed", "worker_lost"])["retry"] == {
        "max_attempts": 2, "retry_on": ["failed", "worker_lost"]}
    assert gl.job(["x"], retry={"max_attempts": 4})["retry"] == {"max_attempts": 4}
    assert gl.job(["x"], retry_on="timed_out")["retry"] == {"retry_on": ["timed_out"]}


@pytest.mark.parametrize("bad", [0, -1, "3", True])
def test_bad_retry_is_refused(bad):
    with pytest.raises(ValueError):
        gl.job(["x"], retry=bad)


def test_unknown_setting_and_empty_command_are_refused():
    with pytest.raises(TypeError, match="unknown job setting"):
        gl.job(["x"], gpu=1)
    with pytest.raises(ValueError):
        gl.job([])


def test_inputs_list_maps_paths_to_themselves_for_upload():
    assert gl.job(["x"], inputs=["data/a.bin"], outputs="out/")["inputs"] == {"data/a.bin": "data/a.bin"}
    assert gl.job(["x"], outputs="out/")["outputs"] == ["out/"]


def test_service_block_defaults_and_options():
    spec = gl.service(["serve"], replicas=2, accelerator="cuda", gpus=1)
    assert spec["service"] == {"replicas": 2, "port": True, "restart": "always", "max_restarts": None,
                               "health": None, "weights": None}
    assert spec["accelerator"] == "cuda" and spec["gpus"] == 1
    spec = gl.service(["serve"], port=False, restart="on_failure", max_restarts=3, health_path="/healthz",
                      weights="sha256:" + "0" * 64)
    assert spec["service"]["health"] == {"http_path": "/healthz"}
    assert spec["service"]["port"] is False and spec["service"]["max_restarts"] == 3


def test_service_refuses_bad_restart_and_replicas():
    with pytest.raises(ValueError):
        gl.service(["s"], restart="sometimes")
    with pytest.raises(ValueError):
        gl.service(["s"], replicas=0)
