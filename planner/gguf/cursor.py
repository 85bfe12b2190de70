"""Bounds-checked little-endian reading from a byte source's prefix, for the GGUF header walk.

Every read says how many bytes it needs; past the end of what the buffer holds, the cursor asks
its source for more (with how many more the parse certainly needs, so a remote source fetches
them in one request), and past the end of the file it refuses in one line.
"""
from __future__ import annotations

import struct
from typing import Any

from planner.core.errors import GGUFError
from planner.gguf.source import ByteSource

_U64 = struct.Struct("<Q")
# How much of a name or value a message quotes: a hostile header's 40 MB "name" is not echoed.
QUOTE_CHARS = 48


def short(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` quoted for a message, cut to `limit` characters of its repr (control bytes print as
    four characters each, so the cut is made after quoting)."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit + 2 else f"{quoted[:limit]}... ({len(text)} characters)"


class Cursor:
    """Reads little-endian values from a source's prefix, asking it for more as the parse goes
    and refusing to step past the file's end. `size` bounds every claimed length (the file's
    size, or the header cap); `avail` is what the buffer holds now; `reserve` is what the rest
    of the header certainly holds after the current item."""

    def __init__(self, source: ByteSource) -> None:
        self.path = source.name
        self.source = source
        self.buf = source.prefix(0)
        self.avail = len(self.buf)
        self.size = source.bound
        self.pos = 0
        self.reserve = 0

    def fill(self, end: int, certain: int = 0) -> None:
        """Make the buffer hold bytes up to `end` if the file has them."""
        if end > self.avail:
            self.buf = self.source.prefix(end, certain=certain + self.reserve)
            self.avail = len(self.buf)
            if self.source.size is not None:
                self.size = self.source.size

    def need(self, n_bytes: int, what: str, certain: int = 0) -> None:
        if n_bytes >= 0 and self.pos + n_bytes <= self.avail:
            return
        if n_bytes >= 0:
            self.fill(self.pos + n_bytes, certain)
        if n_bytes < 0 or self.pos + n_bytes > self.avail:
            raise GGUFError(self.path, f"truncated header: {what} at byte {self.pos} needs {n_bytes} bytes, "
                                       f"the file has {max(0, self.avail - self.pos)} left")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str, limit: int | None = None) -> str:
        length = self.unpack("<Q", f"length of {what}")
        if limit is not None and length > limit:
            raise GGUFError(self.path, f"{what} is {length} bytes long, more than the {limit} allowed", self.pos - 8)
        if length > self.size - self.pos:
            raise GGUFError(self.path, f"hostile header: {what} claims {length} bytes, "
                                       f"only {self.size - self.pos} remain in the file")
        self.need(length, what)
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int, what: str) -> None:
        # the hot loop of a 262k-token vocabulary: a bound unpack and locals only
        buf, pos, avail, u64 = self.buf, self.pos, self.avail, _U64.unpack_from
        for i in range(count):
            if pos + 8 > avail:
                self.pos = pos
                self.need(8, f"an element of {what}", certain=8 * (count - i - 1))
                buf, avail = self.buf, self.avail
            (length,) = u64(buf, pos)
            pos += 8 + length
            if pos > avail:
                if pos > self.size:
                    self.pos = pos - length
                    raise GGUFError(self.path, f"hostile header: an element of {what} claims {length} bytes, "
                                               f"past the end of the file")
                self.pos = pos - length
                self.need(length, f"an element of {what}", certain=8 * (count - i - 1))
                buf, avail = self.buf, self.avail
        self.pos = pos
