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
