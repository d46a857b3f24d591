"""Bad input exits 2 with one `Error:` line, no traceback, and changes nothing (docs/cli.md, "Exit status").

Each case is a command line as a user would type it; `{home}` is a home with a state file (for
`gpulayer sql`), `{two}` a job file with `gpus = "two"`. REMOTE cases run against a real control
plane process; the others with no server configured (where a bad `--array` once reached a local
control plane and came back as a refusal, exit 1).
"""
from __future__ import annotations

import pytest

from gpulayer.cli import main

NO_SERVER = [
    (["submit", "--array", "abc", "--", "true"], "'abc' is not an index"),
    (["submit", "--dry-run", "--array", "abc", "--", "true"], "'abc' is not an index"),
    (["submit", "--array", "5-1", "--", "true"], "'5-1': a range goes up"),
    (["submit", "--dry-run", "--array", "5-1", "--", "true"], "'5-1': a range goes up"),
    (["submit", "--dry-run", "--array", "0-9%0", "--", "true"], "the running cap after % is a whole number"),
    (["submit", "-f", "{two}"], "gpus is a whole number (0 or more), not 'two'"),
    (["submit", "-f", "{two}", "--dry-run"], "gpus is a whole number (0 or more), not 'two'"),
    (["submit", "--source", "/nonexistent", "--", "true"], "--source /nonexistent: does not exist"),
    (["submit", "--dry-run", "--source", "/nonexistent", "--", "true"], "--source /nonexistent: does not exist"),
    (["submit", "--source", "{two}", "--", "true"], "is not a directory"),
    (["submit", "--input", "/nonexistent", "--", "true"], "--input /nonexistent: does not exist"),
    (["--url", "127.0.0.1:8470", "job", "list"],
     "the URL needs a scheme, e.g. https://127.0.0.1:8470"),
    (["--url", "https://127.0.0.1:1", "--ca-file", "/nonexistent", "job", "list"],
     "CA file /nonexistent (--ca-file, GPULAYER_CA_FILE): does not exist"),
    (["--home", "{empty}", "usage"], "no control plane configured"),
    (["sql", "--home", "{home}", "DELETE FROM jobs"], "refused: the state file is opened read-only"),
    (["sql", "--home", "{home}", "UPDATE jobs SET priority = 9 RETURNING id"], "opened read-only"),
    (["sql", "--home", "{home}", "PRAGMA journal_mode=delete"], "opened read-only"),
    (["sql", "--home", "{home}", "SELEC 1"], "syntax error"),
    (["sql", "--home", "{home}", "SELECT * FROM no_such_table"], "no such table"),
    (["sql", "--home", "{home}", "SELECT :id"], "binding parameter :id"),
]

REMOTE = [
    (["submit", "--array", "abc", "--", "true"], "'abc' is not an index"),
    (["submit", "-f", "{two}"], "not 'two'"),
    (["submit", "--source", "/nonexistent", "--", "true"], "--source /nonexistent: does not exist"),
    (["submit", "--gpus", "99999", "--", "true"], "gpus: must be between 0 and 1024"),  # the server's 400
    (["submit", "--priority", "bogus", "--", "true"], "no priority class of this server"),
    (["submit", "--label", "bad key!=x", "--", "true"], "label key 'bad key!'"),
    (["submit", "--output", "../x", "--", "true"], "must be a relative path inside the task directory"),
    (["user", "add", "Bad Name"], "name: must be 1-64 lower-case letters"),
    (["usage", "--by", "bogus"], "by: must be one of user, project, job-name or label:KEY"),
]


@pytest.fixture
def paths(tmp_path):
    from gpulayer.server.store.db import Store
    home = tmp_path / "state-home"
    home.mkdir()
    Store(home / "state.db").close()
    two = tmp_path / "two.toml"
    two.write_text('command = ["true"]\ngpus = "two"\n')
    (tmp_path / "empty").mkdir()
    return {"home": str(home), "two": str(two), "empty": str(tmp_path / "empty")}


def _run(capsys, args, paths):
    code = main([a.format(**paths) for a in args])
    return code, *capsys.readouterr()


def _assert_usage_error(code, out, err, words):
    assert code == 2, (code, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    assert out == "", out


@pytest.mark.parametrize("args,words", NO_SERVER, ids=[" ".join(a) for a, _ in NO_SERVER])
def test_bad_input_exits_2_with_one_line(args, words, paths, capsys, clean_env):
    _assert_usage_error(*_run(capsys, args, paths), words)
    assert not (clean_env / "state.db").exists()  # no local control plane was started for it


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    from gpulayer.testing import ControlPlaneProcess
    with ControlPlaneProcess(tmp_path_factory.mktemp("exit-codes")) as plane:
        yield plane


@pytest.mark.parametrize("args,words", REMOTE, ids=[" ".join(a) for a, _ in REMOTE])
def test_bad_input_to_a_server_exits_2_and_changes_nothing(args, words, plane, paths, capsys, monkeypatch):
    for key, value in plane.cli_env().items():
        monkeypatch.setenv(key, value)
    _assert_usage_error(*_run(capsys, args, paths), words)
    assert plane.sql("SELECT count(*) FROM jobs") == [(0,)]
    assert plane.sql("SELECT count(*) FROM users WHERE name LIKE 'bad%'") == [(0,)]
