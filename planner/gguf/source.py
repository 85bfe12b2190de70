"""Where a model's header bytes come from: a local file, an HTTP(S) URL, or the header cache.

The header readers (GGUF, safetensors) parse from the start of a file and only ever need a
prefix of it, so a source hands out `prefix(n)`: a buffer holding at least the file's first n
bytes (all of it, if the file is shorter). A local file is memory-mapped whole (here); a URL
is read by Range requests through the header cache (planner.gguf.remote).
"""
from __future__ import annotations

import mmap
import os
import stat

from planner.core.errors import GGUFError
from planner.core.units import KiB
from planner.system import net

INITIAL_CHUNK = 256 * KiB   # the first Range request; also the lookahead of every later one
URL_SCHEMES = ("http://", "https://")

Buffer = bytes | bytearray | mmap.mmap


def is_url(location: str) -> bool:
    return location.lower().startswith(URL_SCHEMES)


class ByteSource:
    """A file's bytes from its start. `name` is what messages call it; `size` is the whole file's
    size when known (None: a server that gave no length); `remote` says the weights are not on
    this machine."""

    name: str
    size: int | None
    remote: bool = False

    def prefix(self, n: int, *, certain: int = 0) -> Buffer:
        """A buffer holding at least the file's first `n` bytes (fewer only where the file ends).
        `certain` is how many bytes past n the caller knows it will need (a remote source fetches
        them in the same request)."""
        raise NotImplementedError

    @property
    def bound(self) -> int:
        """The most bytes the header can span: the file's size, or the header cap where unknown."""
        return self.size if self.size is not None else net.current().header_cap_bytes

    def read(self, offset: int, n: int) -> bytes:
        """Up to n bytes at `offset` (fewer only at the end of the file)."""
        return bytes(self.prefix(offset + n)[offset:offset + n])

    def keep(self, header_bytes: int) -> None:
        """The parse is done and the header is the first `header_bytes` bytes (the cache keeps them)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileSource(ByteSource):
    """A local file, memory-mapped: the whole file is the prefix, and nothing is read until touched."""

    def __init__(self, path: str) -> None:
        self.name = path
        try:   # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise GGUFError(path, "no such file") from None
        except OSError as e:
            raise GGUFError(path, f"cannot open: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory or a device opens fine but cannot be mapped
                raise GGUFError(path, "not a regular file")
            self._map: mmap.mmap | None = None
            if st.st_size:   # an empty file cannot be mapped; its readers say what it is not
                try:
                    self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                except OSError as e:
                    raise GGUFError(path, f"cannot map: {e.strerror}") from None
        finally:
            os.close(fd)
        self.size = st.st_size

    def prefix(self, n: int, *, certain: int = 0) -> Buffer:
        return self._map if self._map is not None else b""

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
