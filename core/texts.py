"""Input texts: the default set, reading a texts file, and the checks every text must pass."""

from __future__ import annotations

from pathlib import Path

from .errors import InputError

# The seed's own case plus two sentences of different lengths, so padding shows.
DEFAULT_TEXTS = (
    "a",
    "b",
    "c",
    "The quick brown fox jumps over the lazy dog.",
    "Batched and single runs of the same text should give the same logits, but often they do not.",
)


def validate_texts(texts: list[str] | tuple[str, ...]) -> list[str]:
    """Return the texts as a list, or raise InputError naming the first unusable one (1-based)."""
    texts = list(texts)
    if not texts:
        raise InputError("no texts to compare")
    for number, text in enumerate(texts, start=1):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"text {number} is empty or whitespace only")
    return texts


def read_texts_file(path: str | Path) -> list[str]:
    """One text per line; blank lines are skipped. Raises InputError if unreadable."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read texts file {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"texts file {str(path)!r} is not valid UTF-8 (byte {exc.start})") from exc
    return [line for line in content.splitlines() if line.strip()]
