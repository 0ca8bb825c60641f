"""The lowest version of a dependency that pyproject.toml claims (its `>=` bound), for CI's lowest-versions run.

python scripts/lowest_claimed.py transformers   # prints e.g. 5.19.0
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def lowest(name: str) -> str:
    for line in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == name:
            floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
            if len(floors) == 1:
                return floors[0]
            raise SystemExit(f"{name}: no single >= bound in pyproject.toml ({line})")
    raise SystemExit(f"{name} is not a dependency in pyproject.toml")


if __name__ == "__main__":
    print(lowest(sys.argv[1]))
