"""How far a user's path walks through the code: the engine's modules a command runs through, and how often a call
climbs back up the layers (a callback: a lower package calling into a higher one it was handed). Run on the tiny
built-in; prints one line a walk.

    python scripts/module_walks.py

A room is a module of `batchtui.core` a call enters from another module; a climb is such a call whose callee sits
in a higher layer than its caller (the layers of pyproject.toml's import-linter contract; core's top-level modules
lowest, `compat` above them).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from batchtui.core.cli import main as cli
from batchtui.core.models.builtin import builtin_path

LAYERS = ["cli", "bench", "endpoint", "rollouts experiments", "run", "reports terminal", "invariant", "models",
          "numbers", "compat"]  # fmt: skip
RANK = {package: len(LAYERS) - i for i, names in enumerate(LAYERS) for package in names.split()}


def _rank(module: str) -> int:
    parts = module.split(".")
    return RANK.get(parts[2], 0) if len(parts) > 3 else 0  # (batchtui.core.X: a top-level module, the lowest)


def walk(argv: list[str]) -> tuple[int, int]:
    """(rooms, climbs) of `batchtui argv` run here."""
    rooms: set[str] = set()
    climbs = 0

    def profile(frame, event, arg):
        nonlocal climbs
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if not callee.startswith("batchtui.core") or callee == caller:
            return
        rooms.add(callee)
        if caller.startswith("batchtui.core") and _rank(callee) > _rank(caller):
            climbs += 1

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with contextlib.suppress(SystemExit):
                cli(argv)
    finally:
        sys.setprofile(None)
    return len(rooms), climbs


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="batchtui-walks-"))
    texts = ["a b c", "the quick brown fox"]
    cli(["check", *texts, "--model", "tiny", "--quiet", "--repro", str(folder / "pack")])  # (the pack to replay)
    rollouts = folder / "rollouts.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(builtin_path("tiny"))
    prompt, completion = tokenizer("a b").input_ids, tokenizer(" c d").input_ids
    line = {"prompt_ids": prompt, "completion_ids": completion, "logprobs": [-1.0] * len(completion)}
    rollouts.write_text(json.dumps(line) + "\n")
    walks = {
        "the texts a user types (check TEXT...)": ["check", *texts, "--model", "tiny", "--quiet"],
        "a repro pack (check --from PACK)": ["check", "--from", str(folder / "pack"), "--quiet"],
        "a rollouts file (rollouts FILE)": ["rollouts", str(rollouts), "--model", "tiny", "--quiet"],
    }
    for name, argv in walks.items():
        rooms, climbs = walk(argv)
        print(f"{name}: {rooms} rooms, {climbs} climbs back")


if __name__ == "__main__":
    main()
