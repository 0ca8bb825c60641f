"""Every command line the README and docs/ show is one the tool takes: its command exists and each option it gives is
one that command's --help lists. (What the lines print is held by the tests of each command.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers.paths import DOCS, REPOSITORY

from batchtui.core.cli import COMMANDS, run_command
from batchtui.tui.launcher import app_parser

PAGES = [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md"))]
_PROGRAMS = ("batchtui ", "python -m batchtui.core ")


def _command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each `batchtui ...` line in the page's code blocks (a shell prompt's `$ ` dropped, a
    line ending in `\\` joined with the next, a `# comment` cut), and of each `batchtui ...` in backticks."""
    found: list[tuple[int, str]] = []
    in_block, pending, start = False, "", 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            text = (pending + " " + line.strip()) if pending else line.strip().removeprefix("$ ")
            start = start if pending else number
            if text.endswith("\\"):
                pending = text[:-1]
                continue
            pending = ""
            for part in re.split(r"\s*(?:;|&&|\|)\s*", text.split("  #")[0]):
                if part.startswith(_PROGRAMS):
                    found.append((start, part))
        else:
            found += [(number, m) for m in re.findall(r"`((?:batchtui|python -m batchtui\.core) [^`]*)`", line)]
    return found


def _help(command: str | None, capsys) -> str:
    if command is None:
        return app_parser().format_help()
    assert run_command(command, ["--help"], prog=f"batchtui {command}") == 0
    return capsys.readouterr().out


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_line_in_the_docs_names_options_its_command_takes(page, capsys):
    lines = _command_lines(page)
    helps: dict[str | None, str] = {}
    wrong = []
    for number, line in lines:
        try:
            words = shlex.split(line.replace("...", ""))
        except ValueError:  # (a line cut for the page: an unclosed quote)
            continue
        words = words[3:] if words[:3] == ["python", "-m", "batchtui.core"] else words[1:]
        command = words[0] if words and words[0] in COMMANDS else None
        if words and command is None and words[0].isalpha() and words[0].islower() and words[0] != "check":
            wrong.append(f"{page.name}:{number}: no command {words[0]!r}: {line}")
            continue
        if command is None and words[:1] == []:
            continue
        if command not in helps:
            helps[command] = _help(command, capsys)
        listed = set(re.findall(r"--[a-z0-9][a-z0-9-]*", helps[command]))
        unknown = [option for option in _options(words) if option not in listed]
        if unknown:
            wrong.append(f"{page.name}:{number}: {command or 'the app'} takes no {', '.join(unknown)}: {line}")
    assert not wrong, "\n".join(wrong)


def test_the_reader_of_the_docs_finds_their_command_lines():
    """The test above can fail: the pages hold command lines, across continued lines and in prose too."""
    readme = dict(_command_lines(REPOSITORY / "README.md"))
    assert any("check --dtype bfloat16 --json report.json" in line for line in readme.values())
    served = [line for _, line in _command_lines(DOCS / "served.md")]
    assert any("--save-rollouts r.jsonl" in line and "--samples-per-prompt 4" in line for line in served)
