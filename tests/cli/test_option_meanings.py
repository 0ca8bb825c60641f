"""One meaning per option name: every command's --help (and the app's) read, each option's help text compared with its
default set aside. A name whose text differs between two commands carries two meanings; two names with one text
carry one. Defaults may differ by command (bench repeats its rounds more than endpoint), meanings may not."""

from __future__ import annotations

import contextlib
import io
import re
from collections import defaultdict

import pytest

from batchtui.core.cli import COMMANDS, main
from batchtui.core.settings import DEFAULT_MODEL
from batchtui.tui.launcher import build_app

# (option, command) whose meaning is its command's own, by design, with the reason
OWN_MEANING = {
    ("--model", "endpoint"): "the model as the server names it (the local model is --local's)",
}
_DEFAULT = re.compile(r"\s*\(default: [^()]*(\([^()]*\)[^()]*)*\)")


def _help(argv: list[str], run) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        run(argv)
    return out.getvalue()


@pytest.fixture(scope="module")
def helps(monkeypatch_module) -> dict[str, str]:
    monkeypatch_module.setenv("COLUMNS", "400")  # one line an option where it fits: less to join
    texts = {name: _help([name, "--help"], main) for name in COMMANDS}
    texts["the app"] = _help(["--help"], build_app)
    return texts


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _options(text: str) -> dict[str, str]:
    """Each option's help text, its lines joined, in the --help's words."""
    found: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"^  (-[^ ].*?)(?: {2,}(\S.*))?$", line)
        if heading:
            names = re.findall(r"--[\w-]+", heading.group(1).split(" ")[0] + " " + heading.group(1))
            current = names[0] if names else None
            if current:
                found[current] = heading.group(2) or ""
        elif current and line.startswith("    ") and line.strip():
            found[current] += " " + line.strip()
        else:
            current = None
    return {name: " ".join(text.split()) for name, text in found.items()}


def _meanings(helps: dict[str, str]) -> dict[str, dict[str, str]]:
    """option -> command -> its help without its default."""
    meanings: dict[str, dict[str, str]] = defaultdict(dict)
    for command, text in helps.items():
        for option, said in _options(text).items():
            if option != "--help" and (option, command) not in OWN_MEANING:
                meanings[option][command] = _DEFAULT.sub("", said).strip()
    return meanings


def test_the_help_is_read_whole(helps):
    options = _options(helps["check"])
    assert {"--model", "--dtype", "--json", "--invariant-classes", "--ops"} <= set(options)
    assert all(said for said in options.values()), [o for o, s in options.items() if not s]


def test_one_name_carries_one_meaning_in_every_command(helps):
    split = {option: said for option, said in _meanings(helps).items() if len(set(said.values())) > 1}
    assert not split, "\n".join(f"{option}: {said}" for option, said in split.items())


def test_two_names_never_carry_one_meaning(helps):
    by_text: dict[str, set[str]] = defaultdict(set)
    for option, said in _meanings(helps).items():
        for text in set(said.values()):
            by_text[text].add(option)
    twins = {text: names for text, names in by_text.items() if len(names) > 1}
    assert not twins, twins


def test_every_command_that_loads_a_model_loads_the_same_one_by_default(helps):
    for command in ("check", "generate", "sweep", "bench", "the app"):
        assert f"(default: {DEFAULT_MODEL})" in _options(helps[command])["--model"], command
