"""Task environment: credential filtering, CUDA_VISIBLE_DEVICES, --python, {weights}."""

import os

from agent.run.environment import cuda_visible_devices, filtered_environ, is_credential, task_argv, task_environment
from gpulayer.protocol.assignment import Assignment

BASE = {"task_id": 7, "job_id": 3, "attempt": 2, "index": 0, "command": ["true"], "gpus": [1, 0],
        "env": {"MY_API_TOKEN": "from-job"}}
ASSIGNMENT = Assignment.from_wire(BASE)


def assignment(**fields) -> Assignment:
    return Assignment.from_wire({**BASE, **fields})


def test_credential_like_names_are_removed():
    worker_env = {
        "PATH": "/usr/bin", "HOME": "/root", "LANG": "C",
        "GPULAYER_JOIN_TOKEN": "glj_x", "GPULAYER_TOKEN": "glc_x", "GITHUB_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "a", "DB_PASSWORD": "p", "MYSQL_PASSWD": "p",
        "GOOGLE_APPLICATION_CREDENTIALS": "/c.json", "OPENAI_API_KEY": "k", "SSH_PRIVATE_KEY": "k",
        "SSH_AUTH_SOCK": "/tmp/agent", "hf_token": "lower",
    }
    assert filtered_environ(worker_env) == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C"}
    assert not is_credential("CUDA_HOME")


def test_job_env_and_secrets_pass_and_agent_values_win():
    env = task_environment(
        {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        assignment(env={"MY_API_TOKEN": "from-job", "CUDA_VISIBLE_DEVICES": "9", "GPULAYER_TASK_ID": "x"}),
        "/w/7-2",
        ["0", "1"],
        extra={"PORT": "4242"},
    )
    assert env["MY_API_TOKEN"] == "from-job"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert env["GPULAYER_TASK_ID"] == "7"
    assert (env["GPULAYER_JOB_ID"], env["GPULAYER_ATTEMPT"], env["GPULAYER_OUTPUT_DIR"]) == ("3", "2", "/w/7-2")
    assert env["PORT"] == "4242"


def test_no_gpus_hides_every_device():
    env = task_environment({"CUDA_VISIBLE_DEVICES": "0"}, assignment(gpus=[]), "/w", ["0"])
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_indices_map_through_the_workers_own_visible_devices():
    assert cuda_visible_devices([0, 1], ["4", "6"]) == "4,6"
    assert cuda_visible_devices([2], ["4", "6"]) == "2"
    assert cuda_visible_devices([0, 1], ["GPU-aaaa", "GPU-bbbb"]) == "GPU-aaaa,GPU-bbbb"


def test_python_flag_puts_its_bin_dir_first_and_replaces_python():
    env = task_environment({"PATH": "/usr/bin"}, ASSIGNMENT, "/w", [], python="/opt/venv/bin/python")
    assert env["PATH"].split(os.pathsep)[:2] == ["/opt/venv/bin", "/usr/bin"]
    assert task_argv(["python", "-c", "x"], "/opt/venv/bin/python", None)[0] == "/opt/venv/bin/python"
    assert task_argv(["python3", "x"], None, None)[0] == "python3"


def test_weights_placeholder():
    assert task_argv(["serve", "--model={weights}", "x"], None, "/w/.gpulayer-weights") == ["serve", "--model=/w/.gpulayer-weights", "x"]


def test_array_element_sees_its_index_and_the_array_size():
    env = task_environment({}, assignment(index=41, array_index=41, array_size=1000), "/w", [])
    assert (env["GPULAYER_ARRAY_INDEX"], env["GPULAYER_ARRAY_SIZE"], env["GPULAYER_TASK_INDEX"]) == ("41", "1000", "41")
    plain = task_environment({}, assignment(array_index=None, array_size=None), "/w", [])
    older = task_environment({}, ASSIGNMENT, "/w", [])  # an older server sends neither field
    assert not {"GPULAYER_ARRAY_INDEX", "GPULAYER_ARRAY_SIZE"} & (set(plain) | set(older))
