"""Input texts: the default set, reading a texts file, and the checks every text must pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

# The seed's own case plus sentences of different lengths, so padding shows. On the built-in English model
# in bf16 the fifth, padded in its batch, predicts ' is' batched but ' are' alone after "The presence of
# annotations" (on x86 CPUs here; other kernels round elsewhere).
DEFAULT_TEXTS = (
    "a",
    "b",
    "c",
    "The quick brown fox jumps over the lazy dog.",
    "The presence of annotations does not change the semantics of a function.",
    "Batched and single runs of the same text should give the same logits, but often they do not.",
)

# A texts file larger than this is refused rather than read until memory runs out (`/dev/zero`).
MAX_TEXTS_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class NumberedTexts:
    """Texts with the line each came from (1-based), so every report names the line the user sees."""

    texts: list[str]
    lines: list[int]


def split_lines(content: str) -> list[str]:
    """Lines split on \\n and \\r\\n only: form feeds, U+2028, U+0085 and lone \\r stay inside a text."""
    lines = content.split("\n")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def numbered_texts(lines: list[str]) -> NumberedTexts:
    """The non-blank lines with their line numbers."""
    pairs = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    return NumberedTexts([line for _, line in pairs], [number for number, _ in pairs])


def validate_texts(texts: list[str] | tuple[str, ...], lines: list[int] | None = None) -> list[str]:
    """Return the texts as a list, or raise InputError naming the first unusable one by its line."""
    texts = list(texts)
    if not texts:
        raise InputError("no texts to compare")
    for index, text in enumerate(texts):
        number = lines[index] if lines else index + 1
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"text {number} is empty or whitespace only")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: what Python makes of bytes that are not UTF-8
            raise InputError(f"text {number} is not valid UTF-8 (character {exc.start + 1})") from None
    return texts


def read_texts_file(path: str | Path) -> NumberedTexts:
    """One text per line (a UTF-8 BOM is dropped); blank lines are skipped but keep their numbers."""
    return numbered_texts(read_text_lines(path))


def read_text_lines(path: str | Path) -> list[str]:
    """A texts file's lines, blank ones included, refusing files too large or not UTF-8."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TEXTS_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read texts file {str(path)!r}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_TEXTS_FILE_BYTES:
        raise InputError(f"texts file {str(path)!r} is larger than {MAX_TEXTS_FILE_BYTES // 2**20} MiB")
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"texts file {str(path)!r} is not valid UTF-8 (byte {exc.start})") from exc
    return split_lines(content.removeprefix("\ufeff"))
