"""Which of a command's options name files it reads and which name files it writes, and the check that no file
written is one read (or another written): run on every command's arguments before any work, so that a slip like
`rollouts in.jsonl --json in.jsonl` is one line and exit 2 with the input untouched, never a report over it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from ..errors import InputError
from ..safe_files import is_standard_output, overlapping
from ..visible import literal

# dest -> how the message names it. A file a command both reads and writes (`--records` with `--resume`, the app's
# session) is an output here: that it is also read never makes it safe to share with another option.
INPUTS = {
    "file": "the rollouts file",
    "texts_file": "--texts-file",
    "from_pack": "--from",
    "a": "A",
    "b": "B",
    "rollouts": "--rollouts",
}
OUTPUTS = {
    "json": "--json",
    "records": "--records",
    "save_rollouts": "--save-rollouts",
    "repro": "--repro",
    "session": "--session",
}


def _named(args: argparse.Namespace, roles: dict[str, str]) -> Iterator[tuple[str, str]]:
    for dest, name in roles.items():
        path = getattr(args, dest, None)
        if isinstance(path, str) and path and not is_standard_output(path):
            yield name, path


def check_files_apart(args: argparse.Namespace) -> None:
    """InputError when an output option names a file (or a folder holding one, or one inside a folder) that
    another option reads or writes: compared by resolved path and by inode."""
    inputs, outputs = list(_named(args, INPUTS)), list(_named(args, OUTPUTS))
    for index, (name, path) in enumerate(outputs):
        for other, other_path in inputs:
            if overlapping(path, other_path):
                raise InputError(
                    f"{name} {literal(path)} is {other} ({literal(other_path)}): writing it would replace what it "
                    "holds; give another path"
                )
        for other, other_path in outputs[index + 1 :]:
            if overlapping(path, other_path):
                raise InputError(
                    f"{name} {literal(path)} and {other} {literal(other_path)} are the same file: one would replace "
                    "the other; give another path"
                )
