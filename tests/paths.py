"""Where the tests find the repository's files, wherever a test module sits under tests/."""

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
DOCS = REPOSITORY / "docs"
TEST_DATA = REPOSITORY / "tests" / "data"
