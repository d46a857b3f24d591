"""The CLI without a server: help, usage errors as one `Error:` line, exit statuses."""
import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app, main
from gpulayer.cli.common import parse_duration

runner = CliRunner()


def run(*args, **kw):
    return runner.invoke(app, list(args), **kw)


def _one_error_line(result):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_root_help_names_the_environment_variables():
    result = run("--help")
    assert result.exit_code == 0
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA_FILE", "GPULAYER_HOME"):
        assert var in result.output


@pytest.mark.parametrize("command,var", [(["worker", "start"], "GPULAYER_JOIN_TOKEN"),
                                         (["join"], "GPULAYER_JOIN_TOKEN"),
                                         (["server", "init"], "GPULAYER_HOME"),
                                         (["up"], "GPULAYER_HOME")])
def test_command_help_names_its_variables(command, var):
    result = run(*command, "--help")
    assert result.exit_code == 0 and var in result.output


@pytest.mark.parametrize("args", [
    ["submit"],
    ["submit", "--bogus", "--", "echo"],
    ["submit", "--label", "novalue", "--", "echo"],
    ["submit", "--gpus", "-1", "--", "echo"],
    ["submit", "--restart", "sometimes", "--", "echo"],
    ["job", "status", "abc"],
    ["job", "list", "--limit", "0"],
    ["token", "create", "--name", "n", "--expires", "forever"],
    ["secret", "set", "NAME", "the-value"],
    ["join", "https://x:8470", "--ca-file", "a", "--ca-fingerprint", "sha256:ab"],
    ["server", "start", "--tls-cert", "c.pem"],
    ["nosuchcommand"],
])
def test_usage_errors_are_one_line_and_exit_2(args):
    result = run(*args)
    assert result.exit_code == 2, result.output
    _one_error_line(result)


def test_unreachable_server_exits_1_with_a_clear_line():
    result = run("--url", "http://127.0.0.1:9", "--token", "glc_x", "job", "list")
    assert result.exit_code == 1
    assert "cannot reach the control plane at http://127.0.0.1:9" in _one_error_line(result)


def test_service_needs_a_server():
    result = run("submit", "--target", "local", "--service", "--", "serve")
    assert result.exit_code == 2 and "needs a control plane" in _one_error_line(result)


def test_worker_start_without_a_token_or_url():
    assert "GPULAYER_JOIN_TOKEN" in _one_error_line(run("--url", "http://127.0.0.1:9", "worker", "start"))
    assert "--url" in _one_error_line(run("worker", "start", "--token", "glj_x"))


def test_main_returns_the_status(capsys):
    assert main(["job", "status", "abc"]) == 2
    assert capsys.readouterr().err.startswith("Error: ")
    assert main(["--help"]) == 0


@pytest.mark.parametrize("text,seconds", [("90", 90), ("45s", 45), ("30m", 1800), ("12h", 43200),
                                          ("365d", 365 * 86400), ("2w", 14 * 86400)])
def test_durations(text, seconds):
    assert parse_duration(text, "--expires") == seconds


def _all_commands():
    import typer as _typer

    def walk(group, path):
        for name, command in sorted(group.commands.items()):
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])
            else:
                yield [*path, name]
    return list(walk(_typer.main.get_command(app), []))


@pytest.mark.parametrize("command", _all_commands(), ids=" ".join)
def test_every_command_has_help(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output


def test_explore_without_a_state_file(tmp_path):
    result = run("explore", "--home", str(tmp_path / "nothing"))
    assert result.exit_code == 2 and "no state file" in _one_error_line(result)


def test_progress_bar_draws_on_stderr(capsys):
    from gpulayer.client.transfers import Progress
    bar = Progress("upload x", 10 * 1024 * 1024, enabled=True)
    bar.advance(10 * 1024 * 1024)
    bar.close()
    err = capsys.readouterr().err
    assert "upload x" in err and "100%" in err and err.endswith("\n")
    quiet = Progress("upload y", 10 * 1024 * 1024)  # stderr is not a terminal under pytest
    quiet.advance(1)
    assert capsys.readouterr().err == ""


def test_bad_server_settings_are_one_line_and_exit_2(tmp_path):
    pytest.importorskip("gpulayer.server.process")
    assert run("server", "init", "--home", str(tmp_path / "h")).exit_code == 0
    result = run("server", "start", "--home", str(tmp_path / "h"), "--host", "0.0.0.0", "--port", "0")
    assert result.exit_code == 2 and "--allow-insecure-remote" in _one_error_line(result)
    again = run("server", "init", "--home", str(tmp_path / "h"))
    assert again.exit_code == 1 and "already initialised" in _one_error_line(again)


NOTIFY_OPTIONS = ["--gpu-sample-retention", "--allow-private-webhooks", "--smtp-url", "--smtp-from", "--webhook-retry-base",
                  "--webhook-retry-for", "--webhook-concurrency"]


@pytest.mark.parametrize("command", [["up"], ["server", "start"]], ids=" ".join)
def test_up_and_server_start_take_the_same_notification_and_telemetry_options(command):
    result = run(*command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in NOTIFY_OPTIONS:
        assert option in result.output, option


@pytest.mark.parametrize("args,option", [
    (["--smtp-url", "ftp://mail.example.org"], "--smtp-url"),
    (["--smtp-url", "smtp://mail.example.org:notaport"], "--smtp-url"),
    (["--gpu-sample-retention", "forever"], "--gpu-sample-retention"),
    (["--gpu-sample-retention", "0"], "--gpu-sample-retention"),
    (["--webhook-concurrency", "0"], "--webhook-concurrency"),
    (["--webhook-retry-base", "soon"], "--webhook-retry-base"),
    (["--webhook-retry-for", "-1"], "--webhook-retry-for"),
])
@pytest.mark.parametrize("command", [["up", "--no-worker", "--port", "0"], ["server", "start", "--port", "0"]], ids=" ".join)
def test_a_bad_notification_option_is_a_usage_error_that_starts_nothing(tmp_path, command, args, option):
    home = tmp_path / "up-home"  # not the fixture's GPULAYER_HOME, which exists
    result = run(*command, "--home", str(home), *args)
    assert result.exit_code == 2, result.output
    assert option in _one_error_line(result)
    assert not home.exists()  # nothing made, nothing started
