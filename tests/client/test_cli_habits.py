"""The CLI's habits without a server: version, completion, help, exit codes, certificates, tables."""
from __future__ import annotations

import json
import os
import socket

import pytest
from cryptography import x509
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.cli.common import print_table
from gpulayer.testing import run_cli

runner = CliRunner()


def run(*args, **kw):
    return runner.invoke(app, list(args), **kw)


def _commands():
    import typer

    def walk(group, path):
        yield path
        for name, command in sorted(getattr(group, "commands", {}).items()):
            yield from walk(command, [*path, name])
    return list(walk(typer.main.get_command(app), []))


def test_version():
    from gpulayer import __version__
    result = run("--version")
    assert result.exit_code == 0 and result.output.strip() == f"gpulayer {__version__}"


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "gpulayer")
def test_help_has_no_bool_placeholders(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "<bool>" not in result.output, result.output


def _leaf_commands():
    import typer
    return [path for path in _commands() if path and not getattr(_command_at(typer.main.get_command(app), path),
                                                                  "commands", None)]


def _command_at(group, path):
    for name in path:
        group = group.commands[name]
    return group


@pytest.mark.parametrize("command", _leaf_commands(), ids=" ".join)
def test_every_command_shows_an_example(command):
    assert "Example" in run(*command, "--help").output


def test_shell_completion_is_typers_own():
    # --show-completion detects the shell from the process tree: run it under a real bash (not exec'd), as a
    # person would, so the answer does not depend on what started pytest.
    import subprocess
    from gpulayer.testing import CLI, clean_env
    shown = subprocess.run(["bash", "-c", '"$@"; exit $?', "bash", *CLI, "--show-completion"], env=clean_env(),
                           capture_output=True, text=True, timeout=90)
    assert shown.returncode == 0 and "_GPULAYER_COMPLETE" in shown.stdout
    completed = run_cli(env={"_GPULAYER_COMPLETE": "complete_bash", "COMP_WORDS": "gpulayer job li", "COMP_CWORD": "2"})
    assert completed.stdout.split() == ["list"]


def test_a_bogus_state_is_a_usage_error():
    result = run("--url", "http://127.0.0.1:9", "--token", "glc_x", "job", "list", "--state", "bogus")
    assert result.exit_code == 2 and "not a job state" in result.output


@pytest.mark.parametrize("args,words", [
    (["job", "cancel"], "give the jobs to cancel"),
    (["job", "cancel", "3", "--name", "x*"], "not both"),
    (["job", "list", "--since", "yesterday-ish"], "is not a duration"),
    (["job", "list", "--watch", "--json"], "leave out --json"),
    (["submit", "--target", "local", "--no-cancel-on-interrupt", "--", "true"], "needs a control plane"),
    (["--token", "glj_abc", "job", "list"], "join token"),
    (["--token", "glj_abc", "join", "http://127.0.0.1:9"], "goes after the command"),
    (["join", "http://127.0.0.1:9", "--token", "glc_abc"], "that is a client token"),
])
def test_usage_errors_explained(args, words):
    result = run("--url", "http://127.0.0.1:9", *args) if args[0] == "job" else run(*args)
    assert result.exit_code == 2 and words in result.output, result.output


def test_a_cell_with_a_line_break_stays_on_its_row(capsys):
    print_table([[1, "sh -c 'echo a\necho b'"], [2, "x"]], ["ID", "COMMAND"])
    assert capsys.readouterr().out.splitlines() == ["ID  COMMAND", "1   sh -c 'echo a echo b'", "2   x"]


@pytest.mark.slow  # `server certs` lists this machine's addresses with `ip`, in-process through the CliRunner
def test_server_certs_makes_what_server_start_needs(tmp_path):
    home = tmp_path / "home"
    result = run("server", "certs", "--home", str(home), "--host", "cp.example.net", "--ip", "10.1.2.3", "--json")
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    cert = x509.load_pem_x509_certificates(open(made["cert"], "rb").read())[0]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "cp.example.net" in san.get_values_for_type(x509.DNSName)
    assert "10.1.2.3" in [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    assert made["fingerprint"].startswith("sha256:") and oct(os.stat(made["key"]).st_mode & 0o777) == "0o600"
    again = json.loads(run("server", "certs", "--home", str(home), "--host", "cp.example.net", "--json").output)
    assert again["fingerprint"] == made["fingerprint"]  # the CA is kept
    assert run("server", "certs", "--home", str(home), "--ip", "not-an-ip").exit_code == 2


@pytest.mark.slow  # `server certs` lists this machine's addresses with `ip`, in-process through the CliRunner
def test_server_certs_says_what_to_run_next(tmp_path):
    """On stderr: `server init` while the home has no tokens (start refuses such a home), then `server start`;
    each with the --home given (docs/cli.md's certs block runs them in tests/client/test_docs_examples.py)."""
    home = tmp_path / "home"
    first = run("server", "certs", "--home", str(home))
    assert first.exit_code == 0, first.output
    init, start = first.stderr.splitlines()
    assert init == f"gpulayer server init --home {home}"
    assert start.startswith(f"gpulayer server start --home {home} --host 0.0.0.0 --tls-cert {home}/tls/server.pem ")
    assert run("server", "init", "--home", str(home)).exit_code == 0
    assert run("server", "certs", "--home", str(home)).stderr.splitlines() == [start]


def test_up_on_a_taken_port_says_so_and_touches_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("up", "--home", str(tmp_path / "up-home"), "--host", "127.0.0.1", "--port", str(port))
    assert result.exit_code == 1 and "is `gpulayer up` already running?" in result.output, result.output
    assert not (tmp_path / "up-home").exists()


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    import sys

    from gpulayer.cli.common import style
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert style("failed", "red") == "failed"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert style("failed", "red") != "failed" and "failed" in style("failed", "red")
    monkeypatch.setenv("NO_COLOR", "1")
    assert style("failed", "red") == "failed"
