"""Every subcommand's --help, as printed (issue 24.9): each option says what it is, and each
that has a default says it; `tokentop --help` opens with the subcommands, one line each."""

from __future__ import annotations

import argparse
import re

import pytest
from support import tokentop

from tui.commands import COMMANDS, CONSOLE, entry

SUBCOMMANDS = [*COMMANDS, ""]  # "": the console (options alone)
_SECTION = re.compile(r"^\S.*:$")  # "options:", "target:", "load (…):"
_ENTRY = re.compile(r"^  (\S.*?)(?:\s{2,}(.*))?$")  # an argument, and its help on that line


def printed_help(command: str, monkeypatch, capsys) -> tuple[str, list[argparse.ArgumentParser]]:
    """The real --help text of `command`, and the parser(s) that printed it."""
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def spy(self, file=None):
        parsers.append(self)
        return original(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", spy)
    run = entry(COMMANDS[command] if command else CONSOLE)
    with pytest.raises(SystemExit) as done:
        run(["--help"])
    assert done.value.code == 0
    return capsys.readouterr().out, parsers


def entries(text: str) -> dict[str, str]:
    """Each argument's invocation ("--tick TICK", "run_dir") and its description, read from
    the help text's argument sections."""
    out: dict[str, str] = {}
    current: str | None = None
    in_section = False
    for line in text.splitlines():
        if _SECTION.match(line):
            in_section, current = True, None
        elif not line.strip():
            current = None
        elif in_section and (m := _ENTRY.match(line)) and not line.startswith("   "):
            current = m[1]
            out[current] = m[2] or ""
        elif in_section and current is not None and line.startswith("   "):
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out


def _has_default(action: argparse.Action) -> bool:
    d = action.default
    return not (d is None or d is argparse.SUPPRESS or isinstance(d, bool | list)
                or isinstance(action, argparse._VersionAction))


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_option_is_described_and_says_its_default(command, monkeypatch, capsys):
    text, parsers = printed_help(command, monkeypatch, capsys)
    found = entries(text)
    assert found, text
    undescribed = [name for name, words in found.items() if not words]
    assert not undescribed, f"{command or 'tokentop'}: no description for {undescribed}"
    (parser,) = parsers
    silent = []
    for action in parser._actions:
        if not action.option_strings or not _has_default(action) or \
                action.help in (None, argparse.SUPPRESS):
            continue
        words = next((w for name, w in found.items()
                      if name.split(",")[0].split()[0] in action.option_strings
                      or any(name.startswith(f"{o} ") or name == o or f", {o}" in name
                             for o in action.option_strings)), None)
        assert words is not None, (command, action.option_strings)
        if "default" not in words.lower():
            silent.append(f"{action.option_strings[-1]} (default {action.default!r})")
    assert not silent, f"{command or 'tokentop'} --help does not say the default of {silent}"


def test_tokentop_help_opens_with_the_subcommands_one_line_each():
    done = tokentop("--help")
    assert done.returncode == 0
    head = done.stdout.split("\n\n")
    listed = next(block for block in head if "commands:" in block.lower())
    lines = [line.strip() for line in listed.splitlines()[1:]]
    assert [line.split()[0] for line in lines] == list(COMMANDS)
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # each says what it does
    # before the console's options
    assert done.stdout.index(listed) < done.stdout.index("--url")


def test_eval_help_says_out_is_required_and_sim_help_lists_the_profiles():
    from loadgen.sim.presets import PROFILES

    usage = tokentop("eval", "--help").stdout.split("\n\n")[0]
    assert "--out DIR" in usage and "[--out" not in usage
    sim = tokentop("sim", "--help").stdout
    assert "presets.py" not in sim
    assert all(name in sim for name in PROFILES)
