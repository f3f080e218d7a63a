"""Text detection and unified diffs for workspace changes (pure functions, no I/O)."""

from __future__ import annotations

import difflib

__all__ = ["cut_diff", "decode_text", "is_binary", "unified_diff"]

_UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_NO_NEWLINE = "\n\\ No newline at end of file\n"


def is_binary(data: bytes) -> bool:
    """Whether ``data`` looks binary: a NUL byte early on without a UTF-16/32 byte order mark."""
    return b"\x00" in data[:8192] and not data.startswith(_UTF16_BOMS + _UTF32_BOMS)


def decode_text(data: bytes) -> str | None:
    """Decode UTF-8 (BOM optional) or BOM-marked UTF-16/32 text; ``None`` if it is neither."""
    if data.startswith(_UTF32_BOMS):
        encoding = "utf-32"
    elif data.startswith(_UTF16_BOMS):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        return None


def _lines(text: str) -> list[str]:
    """Split on ``\\n`` only (not on form feeds and the like, as ``splitlines`` would)."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


def unified_diff(before: str, after: str, from_label: str, to_label: str) -> tuple[str, int, int]:
    """Return ``(diff, additions, deletions)`` of two texts in unified format (3 context lines).

    A last line without a newline is marked ``\\ No newline at end of file`` as git does.
    """
    out: list[str] = []
    additions = deletions = 0
    diff = difflib.unified_diff(_lines(before), _lines(after), from_label, to_label)
    for number, line in enumerate(diff):
        if number >= 2:
            additions += line.startswith("+")
            deletions += line.startswith("-")
        out.append(line if line.endswith("\n") else line + _NO_NEWLINE)
    return "".join(out), additions, deletions


def cut_diff(diff: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``diff`` at a line boundary to at most ``max_bytes`` UTF-8 bytes; say if it was cut."""
    if len(diff.encode()) <= max_bytes:
        return diff, False
    kept: list[str] = []
    used = 0
    for line in _lines(diff):
        size = len(line.encode())
        if used + size > max_bytes:
            break
        kept.append(line)
        used += size
    return "".join(kept), True
