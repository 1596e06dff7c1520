"""``futoin-evt --help`` is the manual: every command and subcommand has a one-line
description, every option its help with its default and its environment variable, and the
placeholders are upper case throughout."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from futoin_evt.cli import _parser

#: The environment variables that give options their defaults.
ENV_VARS = (
    "FUTOIN_EVT_URL",
    "FUTOIN_EVT_USER",
    "FUTOIN_EVT_DB",
    "FUTOIN_EVT_SAS_SECRET",
)
#: Options that are not the command's own: argparse's.
SKIPPED = {"help", "version"}


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """(command path, its parser, its line in its parent's list) of every command and
    subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, summaries.get(name)
                yield from commands(sub, (*path, name))


def options(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    """Every argument of every parser (the top one too), but --help and --version."""
    parsers = [((), parser)] + [(path, sub) for path, sub, _ in commands(parser)]
    for path, sub in parsers:
        for action in sub._actions:
            if action.dest in SKIPPED or isinstance(action, argparse._SubParsersAction):
                continue
            yield path, sub, action


def shown_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as ``--help`` prints it (with any default the formatter adds)."""
    formatter = parser._get_formatter()
    return formatter._expand_help(action)


def where(path: tuple[str, ...], action: argparse.Action) -> str:
    name = "/".join(action.option_strings) or action.dest
    return f"futoin-evt {' '.join(path)} {name}"


def test_every_command_and_subcommand_has_a_line_and_a_description() -> None:
    found = list(commands(_parser()))
    assert len(found) > 30  # the walk reaches the subcommands (user add, sas policy add, ...)
    for path, sub, summary in found:
        assert summary, f"futoin-evt {' '.join(path)} has no line in its parent's list"
        assert sub.description, f"futoin-evt {' '.join(path)} --help has no description"
        assert sub.description.rstrip(".").lower() == summary.lower()


def test_every_option_has_help_that_shows_its_default() -> None:
    parser = _parser()
    missing, undefaulted = [], []
    for path, sub, action in options(parser):
        if action.help == argparse.SUPPRESS:
            continue  # hidden: a deprecated alias, or what the supervisor passes its workers
        if not action.help:
            missing.append(where(path, action))
            continue
        takes_value = action.nargs != 0
        optional = action.option_strings and not action.required
        if optional and takes_value and "default" not in shown_help(sub, action):
            undefaulted.append(where(path, action))
    assert missing == [], "no help"
    assert undefaulted == [], "no default shown"


def test_options_that_read_the_environment_name_their_variable() -> None:
    sentinels = {name: f"from-{name.lower()}" for name in ENV_VARS}
    saved = {name: os.environ.get(name) for name in ENV_VARS}
    os.environ.update(sentinels)
    try:
        parser = _parser()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    checked = 0
    for path, sub, action in options(parser):
        for name, sentinel in sentinels.items():
            if action.default == sentinel:
                assert f"${name}" in shown_help(sub, action), where(path, action)
                checked += 1
        if action.dest == "password_stdin" and "--url" in sub._option_string_actions:
            # the password of a user logging in to a server: stdin, else the environment
            assert "$FUTOIN_EVT_PASSWORD" in shown_help(sub, action), where(path, action)
    assert checked > 40


def test_placeholders_are_upper_case() -> None:
    lower = []
    for path, _, action in options(_parser()):
        if action.nargs == 0 or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            if action.choices is not None and action.metavar is None:
                continue  # shown as {full,normal}: the choices themselves
            shown = str(action.metavar or action.dest.upper())
        else:
            shown = str(action.metavar or action.dest)
        if shown != shown.upper():
            lower.append(f"{where(path, action)}: {shown}")
    assert lower == []


def test_serve_help_is_the_manual() -> None:
    """What the first reader of ``serve --help`` looks for, printed by the command itself."""
    result = subprocess.run(
        [sys.executable, "-m", "futoin_evt", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("FUTOIN_EVT_")},
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # the lines joined as they wrap
    for said in (
        "Run the server.",
        "(default: $FUTOIN_EVT_DB, else futoin-evt.sqlite)",
        "(default: 127.0.0.1)",
        "(default: 8480)",
        "(default: full)",
        "(default: 120.0)",
        "--discard-interval T seconds between two rounds of discarding",
        "PORT alone (or :PORT) listens on 127.0.0.1",
    ):
        assert said in text, said
    assert "needs the 'amqp' extra" not in text


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["add", "--help"], "usage: futoin-evt add [-h] [--key KEY] [--url URL]"),
        (["grant", "--help"], "[--as USER]"),
        (["tail", "--help"], "[--stream NAME] [--partition P]"),
    ],
)
def test_command_help_names_its_placeholders(command: list[str], said: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "futoin_evt", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert said in " ".join(result.stdout.split())
    assert "--user" not in result.stdout or command[0] != "grant"
