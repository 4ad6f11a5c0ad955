"""Every `areal` command the README and docs/ show in a shell block parses as the CLI parses it (its command,
options and arguments), names recipe files that exist, and sets config fields the recipe accepts: a command a
reader copies runs, or fails only on the paths it stands for."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
import typer

from areal.cli.app import app
from areal.graph.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
SHELL = {"bash", "sh", "shell", "console"}


def shown_commands() -> list[tuple[str, list[str]]]:
    """(file:line, argv after `areal`) for each `areal ...` line of a shell block, continuation lines joined."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shell, pending, start = False, "", 0
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            if line.startswith("```"):
                shell = not shell and line[3:].strip() in SHELL
                continue
            if not shell or not (pending or line.startswith("areal ")):
                continue
            start = start if pending else number
            pending += line.removesuffix("\\") + " "
            if not line.endswith("\\"):
                found.append((f"{doc.relative_to(ROOT)}:{start}", shlex.split(pending, comments=True)[1:]))
                pending = ""
    return found


COMMANDS = shown_commands()


def test_the_docs_show_the_commands_of_the_cli():
    assert {argv[0] for _, argv in COMMANDS} >= {"run", "viz", "eval", "export", "plot", "view", "trace"}


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_a_command_the_docs_show_parses_and_its_recipe_takes_its_settings(argv):
    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="areal")
    name, command = argv[0], group.get_command(ctx, argv[0])
    assert command is not None, f"areal has no command {name!r}"
    params = command.make_context(name, argv[1:], parent=ctx).params  # an unknown option or a bad value raises
    recipe = params.get("recipe")
    if recipe is None:
        return
    assert (ROOT / recipe).is_file(), f"{recipe}: no such recipe"
    if name == "run":
        overrides = [*params["set_"], *([f"mode={params['mode']}"] if params["mode"] else [])]
        load_recipe(ROOT / recipe, overrides)  # a field the config does not have, or a value it refuses, raises
