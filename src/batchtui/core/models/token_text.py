"""How a single token is shown: its text where it is text, its bytes where it is part of a character.

Decoding one token of a multi-byte character gives U+FFFD ('�') for every such token, which hides
which byte it is. Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) spell each byte with a printable
stand-in character, and SentencePiece byte fallback names them `<0xE2>`: either way the byte is
recoverable and is shown as `<0xE2>`.
"""

from __future__ import annotations

import re
from functools import cache

_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


@cache
def _byte_of_stand_in() -> dict[str, int]:
    """The table inverted: printable stand-in character -> byte value."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_label(decoded: str, piece: str | None) -> str:
    """`decoded` (the tokenizer's decode of the one token), unless it hides bytes behind '�': then the
    bytes, from the vocabulary's own spelling `piece` of the token."""
    if "\ufffd" not in decoded or piece is None:
        return decoded
    if _BYTE_PIECE.fullmatch(piece):
        return piece.upper().replace("0X", "0x")
    stand_ins = _byte_of_stand_in()
    if not all(ch in stand_ins for ch in piece):
        return decoded
    raw = bytes(stand_ins[ch] for ch in piece)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"<0x{byte:02X}>" for byte in raw)


_BYTE_PIECES = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")
CONTINUATION = "·"  # a byte piece inside a character whose start another piece shows


def readable_pieces(tokens: tuple[str, ...] | list[str]) -> list[str]:
    """Each token as a strip of tokens shows it: a run of byte pieces (`<0xE6>` `<0x97>` `<0xA5>`) that
    spells characters shows each character on the piece where it starts, and `·` on the pieces that only
    continue one; byte pieces that spell no character, and every other token, stay as they are."""
    shown = list(tokens)
    i = 0
    while i < len(tokens):
        if not _BYTE_PIECES.fullmatch(tokens[i]):
            i += 1
            continue
        end = i
        while end < len(tokens) and _BYTE_PIECES.fullmatch(tokens[end]):
            end += 1
        _spell_run(tokens, i, end, shown)
        i = end
    return shown


def _utf8_length(lead: int) -> int:
    """How many bytes the UTF-8 character that starts with `lead` takes (0: not a lead byte)."""
    for size, (mask, value) in enumerate(((0x80, 0x00), (0xE0, 0xC0), (0xF0, 0xE0), (0xF8, 0xF0)), start=1):
        if lead & mask == value:
            return size
    return 0


def _spell_run(tokens, start: int, end: int, shown: list[str]) -> None:
    owner = []  # the token each byte of the run came from
    raw = bytearray()
    for index in range(start, end):
        for piece in re.findall(r"<0x([0-9A-Fa-f]{2})>", tokens[index]):
            raw.append(int(piece, 16))
            owner.append(index)
    labels: dict[int, str] = {}
    keep: set[int] = set()  # tokens with a byte that starts no character: shown as bytes
    at = 0
    while at < len(raw):
        size = _utf8_length(raw[at])
        try:
            char = bytes(raw[at : at + size]).decode("utf-8") if size and at + size <= len(raw) else None
        except UnicodeDecodeError:
            char = None
        if char is None:
            keep.add(owner[at])
            at += 1
            continue
        labels[owner[at]] = labels.get(owner[at], "") + char
        for byte in range(at + 1, at + size):
            labels.setdefault(owner[byte], "")
        at += size
    for index, label in labels.items():
        if index not in keep:
            shown[index] = label or CONTINUATION
