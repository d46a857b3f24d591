"""docs/cli.md documents every command and every option of the CLI."""
import re
from pathlib import Path

import pytest
import typer

from gpulayer.cli.app import app

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def _commands(group, path=("gpulayer",)):
    for name, command in sorted(group.commands.items()):
        here = (*path, name)
        if hasattr(command, "commands"):
            yield from _commands(command, here)
        else:
            yield " ".join(here), command


COMMANDS = list(_commands(typer.main.get_command(app)))


def _mentions(text, option):
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _section(title):
    start = DOC.index(f"### {title}\n")
    end = DOC.find("\n### ", start + 1)
    return DOC[start:end if end != -1 else None]


@pytest.mark.parametrize("path,command", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_command_and_its_options_are_documented(path, command):
    assert f"### {path}\n" in DOC, f"docs/cli.md has no section for `{path}`"
    section = _section(path)
    for param in command.params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--") and opt != "--help":
                assert _mentions(section, opt), f"`{path}`: option {opt} is not in its docs/cli.md section"
        envvar = getattr(param, "envvar", None)
        if envvar:
            assert envvar in section or envvar in DOC, f"`{path}`: {envvar} is undocumented"


def test_global_options_are_documented():
    for param in typer.main.get_command(app).params:
        for opt in param.opts:
            if opt != "--help":
                assert _mentions(DOC, opt)
