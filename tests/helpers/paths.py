"""Where the tests find the repository's files, wherever a test module sits under tests/."""

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE = REPOSITORY / "src" / "batchtui"  # the packages batchtui.core and batchtui.tui
DOCS = REPOSITORY / "docs"
TEST_DATA = REPOSITORY / "tests" / "data"
