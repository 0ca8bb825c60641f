"""The frameworks' private names are read in one place, `batchtui.core.compat`: their next release is met there."""

from __future__ import annotations

import re

from helpers.paths import REPOSITORY, SOURCE

# A private name of torch, transformers, argparse or textual: a module path with a `_part`, or an attribute of
# theirs that the engine reads.
PRIVATE = re.compile(
    r"\b(torch|transformers|textual|argparse)(\.\w+)*\._[a-zA-Z]\w*"
    r"|\._(attn_implementation\w*|can_set_attn_implementation|supports_sdpa|actions|option_string_actions)\b"
    r"|\b_get_help_string\b"
)


def test_no_framework_internal_is_named_outside_the_compat_door():
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.parent.name == "compat":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if PRIVATE.search(code):
                found.append(f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_door_itself_is_found_by_the_rule():
    """The rule is no dead letter: the door's own modules hold what it looks for."""
    door = "".join(path.read_text() for path in (SOURCE / "core" / "compat").glob("*.py"))
    assert len(PRIVATE.findall(door)) >= 6


def test_a_venv_that_is_a_symlink_is_ignored_as_a_folder_would_be(tmp_path):
    """`.venv` and `.venv-vllm` linked to a venv elsewhere (a shared one) stay out of `git status`: a pattern with a
    trailing slash matches folders only, not a link."""
    import shutil
    import subprocess

    shutil.copy(REPOSITORY / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "elsewhere").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    for name in (".venv", ".venv-vllm"):
        (tmp_path / name).symlink_to(tmp_path / "elsewhere")
        assert subprocess.run(["git", "check-ignore", "-q", name], cwd=tmp_path).returncode == 0, name
