"""A model's header over HTTP(S), and the header cache that makes a second read free.

A URL is read with Range requests: one first request of INITIAL_CHUNK bytes, then only as much
more as the parse says it certainly needs plus one lookahead chunk, so a header is read in a few
round trips and at most one chunk past its end — never the tensor data. A server that ignores
Range is streamed from byte 0 and the stream dropped at the header's end. The header cache keeps
each URL's header on disk with its ETag / Last-Modified, so a second read is one conditional
request answered 304, without a body.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import BadInput, RemoteError
from planner.core.units import fmt_bytes
from planner.gguf.source import INITIAL_CHUNK, Buffer, ByteSource
from planner.system import http, net
from planner.system.files import write_atomic


class HTTPSource(ByteSource):
    """An http(s) URL read by Range requests (see the module docstring). `requests` and
    `bytes_received` count what this source cost on the network."""

    remote = True

    def __init__(self, url: str, *, validators: http.Validators | None = None) -> None:
        self.name = url
        self.size: int | None = None
        self.validators = http.Validators()
        self.not_modified = False          # the first answer was 304: the caller's copy is current
        self.requests = 0
        self.bytes_received = 0
        self._buf = bytearray()
        self._conditional = validators
        self._stream: http.RangeBody | None = None   # a server that ignored Range: its 200 body, open
        self._final: str | None = None               # the URL the first answer came from, redirects followed
        self._started = False

    def prefix(self, n: int, *, certain: int = 0) -> Buffer:
        while len(self._buf) < n and not self._at_end():
            have = len(self._buf)
            self._grow(n, certain)
            if len(self._buf) == have and not self.not_modified:
                raise BadInput(f"{self.name}: the server sent no bytes from offset {have} on, "
                               f"though the file is {self.size} bytes")
        return self._buf

    def _at_end(self) -> bool:
        return self.size is not None and len(self._buf) >= self.size

    def _target(self, n: int, certain: int) -> int:
        """How far to read: what the parse needs and knows it will need, plus one chunk of
        lookahead. Every byte counted in `certain` lies inside the header, so no request reaches
        more than INITIAL_CHUNK past the header's end."""
        cap = net.current().header_cap_bytes
        if n > cap:
            raise BadInput(f"{self.name}: the header is larger than the {fmt_bytes(cap)} cap "
                           f"(FITPLAN_HEADER_CAP_MIB)")
        target = n + certain + INITIAL_CHUNK if self._started else max(n + certain, INITIAL_CHUNK)
        target = min(target, cap)
        return target if self.size is None else min(target, self.size)

    def _grow(self, n: int, certain: int) -> None:
        target = self._target(n, certain)
        if self._stream is not None:
            self._take(self._stream, target - len(self._buf))
            return
        first, start = not self._started, len(self._buf)
        body = self._open(start, target, first)
        self._started = True
        keep_open = False
        try:
            if first:
                self._first_answer(body)
                if body.not_modified:
                    return
            elif body.validators.etag != self.validators.etag:
                raise BadInput(f"{self.name}: the file changed while its header was being read; run again")
            if body.status == 200:   # Range ignored: the body is the whole file from byte 0
                self._skip(body, start)
                keep_open = True
            self._take(body, target - start)
        finally:
            if keep_open:
                self._stream = body   # more of the header may be needed: read on from here
            else:
                body.close()

    def _open(self, start: int, stop: int, first: bool) -> http.RangeBody:
        """The first request goes to the URL (conditionally, with a cache entry's validators);
        later ones straight to where its redirects led (a storage host's signed URL: one round
        trip each instead of two), back to the URL if that address has stopped answering."""
        self.requests += 1
        if first or self._final is None or self._final == self.name:
            body = http.open_range(self.name, start, stop, validators=self._conditional if first else None)
            self._final = body.final_url
            return body
        try:
            return http.open_range(self._final, start, stop)
        except RemoteError as e:
            if e.status not in (401, 403, 404, 410):   # named by the URL asked for, not a signed one
                raise RemoteError(self.name, e.problem, e.status) from None
        self.requests += 1
        return http.open_range(self.name, start, stop)

    def _first_answer(self, body: http.RangeBody) -> None:
        self.validators = body.validators
        self.not_modified = body.not_modified
        self.size = body.size
        if body.status == 200 and body.size is None:
            raise BadInput(f"{self.name}: the server supports neither Range requests nor Content-Length, "
                           f"so the header's extent cannot be checked")

    def _skip(self, body: http.RangeBody, n: int) -> None:
        while n > 0:
            chunk = body.read(min(n, 1 << 20))
            if not chunk:
                return
            n -= len(chunk)
            self.bytes_received += len(chunk)

    def _take(self, body: http.RangeBody, n: int) -> None:
        data = body.read(n)
        self.bytes_received += len(data)
        self._buf += data
        if len(data) < n and self.size is None:   # the body ended: so does the file
            self.size = len(self._buf)

    def seed(self, data: bytes, size: int | None) -> None:
        """Start from bytes known to be the file's (a header cache entry the server said is current)."""
        self._buf = bytearray(data)
        self.size = size

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


@dataclass(frozen=True)
class CacheEntry:
    url: str
    validators: http.Validators
    size: int | None     # the remote file's whole size
    data: Path           # the header bytes: the file's first n bytes, itself a header-only GGUF


class HeaderCache:
    """Headers of remote files on disk, keyed by URL: KEY.header (the bytes: a header-only file) and KEY.json (URL,
    validators, size). Bounded by `limit` bytes; the least recently used entries go first.
    Writes are atomic (a temporary file renamed into place), data before its description, so a
    reader sees a whole entry or none."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit

    def _key(self, url: str) -> str:
        return hashlib.sha256(url.encode()).hexdigest()[:32]

    def get(self, url: str) -> CacheEntry | None:
        meta_path = self.root / f"{self._key(url)}.json"
        data = meta_path.with_suffix(".header")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta["url"] != url or data.stat().st_size != meta["n_bytes"]:
                return None
            os.utime(meta_path)   # most recently used
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return CacheEntry(url, http.Validators(meta.get("etag"), meta.get("last_modified")), meta.get("size"), data)

    def put(self, url: str, header: bytes, size: int | None, validators: http.Validators) -> None:
        if not validators or len(header) > self.limit:
            return   # nothing to revalidate with, or it would evict everything else
        key = self._key(url)
        meta = {"url": url, "etag": validators.etag, "last_modified": validators.last_modified,
                "size": size, "n_bytes": len(header)}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            write_atomic(self.root / f"{key}.header", lambda tmp: tmp.write_bytes(header))
            write_atomic(self.root / f"{key}.json", lambda tmp: tmp.write_text(json.dumps(meta), encoding="utf-8"))
            self._evict(keep=key)
        except (OSError, BadInput):
            pass   # a cache that cannot be written is only a slower next run

    def _evict(self, keep: str) -> None:
        entries = []
        for meta in self.root.glob("*.json"):
            try:
                st = meta.stat()
                n = st.st_size + meta.with_suffix(".header").stat().st_size
            except OSError:
                continue
            entries.append((st.st_mtime, meta, n))
        total = sum(n for _, _, n in entries)
        for _, meta, n in sorted(entries, key=lambda e: e[0]):
            if total <= self.limit:
                break
            if meta.stem == keep:
                continue
            meta.unlink(missing_ok=True)
            meta.with_suffix(".header").unlink(missing_ok=True)
            total -= n


class CachedSource(HTTPSource):
    """A URL read through the header cache: with an entry, the first request is conditional and a
    304 serves the cached bytes; whatever was read from the network is stored when the parse ends."""

    def __init__(self, url: str, cache: HeaderCache) -> None:
        self._cache = cache
        self._entry = cache.get(url)
        self._cached_bytes = 0
        super().__init__(url, validators=self._entry.validators if self._entry else None)

    def _first_answer(self, body: http.RangeBody) -> None:
        super()._first_answer(body)
        if body.not_modified and self._entry is not None:
            if not self.validators:   # a 304 need not repeat them; the entry's still identify the file
                self.validators = self._entry.validators
            try:
                self.seed(self._entry.data.read_bytes(), self._entry.size)
                self._cached_bytes = len(self._buf)
            except OSError:   # evicted by another process meanwhile: read the file afresh
                self._started, self._conditional = False, None

    def keep(self, header_bytes: int) -> None:
        if self.not_modified and len(self._buf) <= self._cached_bytes:
            return   # served from the cache, nothing new
        self._cache.put(self.name, bytes(self._buf[:header_bytes]), self.size, self.validators)


def open_remote(url: str) -> HTTPSource:
    """A URL's source: through the header cache unless its bound is 0."""
    settings = net.current()
    if settings.header_cache_bytes <= 0:
        return HTTPSource(url)
    return CachedSource(url, HeaderCache(settings.header_cache, settings.header_cache_bytes))
