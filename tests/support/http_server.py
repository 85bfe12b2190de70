"""Real HTTP servers on 127.0.0.1 for the remote-model tests: no mocks of the network.

A `LoopbackServer` is a threaded HTTP/1.1 server on an ephemeral port. Routes are mounted by path
(exact, or a prefix): a file on disk (served with Range, ETag, Last-Modified and 304s, read in
chunks so a sparse file of tens of GiB costs nothing), bytes, a JSON document, a redirect, or a
handler function. Switches reproduce the servers fitplan meets: `ranges=False` (Range ignored,
200 with the whole body), `lengths=False` (no Content-Length: the body runs to the connection's
close), `token=` (401 without `Authorization: Bearer TOKEN`), `etags=False` / `last_modified=False`
(a file answered without that validator). Every request is recorded
(`log`, `requests(path)`, `body_bytes(path)`), with the headers it carried.

Use the `http_servers` fixture (tests/conftest.py): `srv = http_servers.start()`; several servers
make a front host and a "storage" host to redirect to.
"""
from __future__ import annotations

import email.utils
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str                   # without the query
    query: str
    headers: dict[str, str]     # lower-case names


@dataclass
class Reply:
    """What a handler answers: a status, headers, and a body (bytes, or a file served whole or by Range)."""

    status: int = 200
    body: bytes | Path = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Redirect:
    """Answer with `status` and Location: `target` (the request's query is kept)."""

    target: str
    status: int = 302


Handler = Callable[[Request], Reply]
Target = bytes | Path | dict | list | Redirect | Handler


@dataclass
class Record:
    """One request as the server saw it: what it answered and how many body bytes it wrote. It is
    logged before the answer goes out and its bytes are counted before each write, so a client
    that has its answer always finds it counted."""

    method: str
    path: str
    headers: dict[str, str]
    status: int
    body_bytes: int


@dataclass
class _Mount:
    target: Target
    prefix: bool
    protected: bool


def _etag(path: Path) -> str:
    st = path.stat()
    return '"' + hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16] + '"'


def _http_date(path: Path) -> str:
    return email.utils.formatdate(int(path.stat().st_mtime), usegmt=True)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, stop) of a single `bytes=a-b` / `bytes=a-` / `bytes=-n` range, None if unsatisfiable."""
    spec = header.strip().removeprefix("bytes=")
    first, _, last = spec.partition("-")
    if not first:
        n = int(last)
        return (max(0, size - n), size) if n else None
    start = int(first)
    stop = min(size, int(last) + 1) if last else size
    return (start, stop) if start < size and start < stop else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up (after an error answer, or once it has the header it needed) is
        ordinary here; anything else is printed as socketserver prints it."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    def __init__(self, *, ranges: bool = True, lengths: bool = True, token: str | None = None,
                 etags: bool = True, last_modified: bool = True) -> None:
        self.ranges = ranges
        self.lengths = lengths
        self.token = token
        self.etags = etags
        self.last_modified = last_modified
        self.log: list[Record] = []
        self._mounts: dict[str, _Mount] = {}
        self._lock = threading.Lock()
        owner = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner._handle(self, "GET")

            def do_HEAD(self) -> None:
                owner._handle(self, "HEAD")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    # --- configuration ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + "/" + path.lstrip("/")

    def mount(self, path: str, target: Target, *, prefix: bool = False, protected: bool = True) -> str:
        """Serve `target` at `path` (or, with prefix=True, at every path under it; the longest mount
        wins). A dict or list is served as JSON. `protected` routes need the token when one is set.
        Returns the route's URL."""
        self._mounts["/" + path.lstrip("/")] = _Mount(target, prefix, protected)
        return self.url(path)

    def serve_file(self, path: str, file: str | os.PathLike[str]) -> str:
        return self.mount(path, Path(file))

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- what the server saw ---------------------------------------------------------------------

    def records(self, path: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.log if path is None or r.path == "/" + path.lstrip("/")]

    def requests(self, path: str | None = None) -> int:
        return len(self.records(path))

    def body_bytes(self, path: str | None = None) -> int:
        return sum(r.body_bytes for r in self.records(path))

    def reset(self) -> None:
        with self._lock:
            self.log.clear()

    # --- serving ---------------------------------------------------------------------------------

    def _find(self, path: str) -> _Mount | None:
        if path in self._mounts:
            return self._mounts[path]
        best = max((p for p, m in self._mounts.items() if m.prefix and path.startswith(p.rstrip("/") + "/")),
                   key=len, default=None)
        return self._mounts[best] if best is not None else None

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        req = Request(method, parts.path, parts.query, {k.lower(): v for k, v in h.headers.items()})
        mount = self._find(req.path)
        if mount is None:
            reply = Reply(404, b"not found\n")
        elif mount.protected and self.token and req.headers.get("authorization") != f"Bearer {self.token}":
            reply = Reply(401, b"unauthorized\n")
        else:
            reply = self._reply(req, mount.target)
        self._send(h, req, reply)

    def _reply(self, req: Request, target: Target) -> Reply:
        if isinstance(target, Redirect):
            location = target.target + (f"?{req.query}" if req.query else "")
            return Reply(target.status, b"", {"Location": location})
        if isinstance(target, (dict, list)):
            return Reply(200, json.dumps(target).encode(), {"Content-Type": "application/json"})
        if isinstance(target, bytes):
            return Reply(200, target, {"Content-Type": "application/octet-stream"})
        if isinstance(target, Path):
            return self._file_reply(req, target)
        return target(req)

    def _file_reply(self, req: Request, path: Path) -> Reply:
        etag = _etag(path) if self.etags else None
        modified = _http_date(path) if self.last_modified else None
        headers = {"Content-Type": "application/octet-stream"}
        if etag:
            headers["ETag"] = etag
        if modified:
            headers["Last-Modified"] = modified
        if self.ranges:
            headers["Accept-Ranges"] = "bytes"
        # RFC 9110 13.2.2: If-None-Match decides when present, If-Modified-Since only without it
        inm, ims = req.headers.get("if-none-match"), req.headers.get("if-modified-since")
        if (inm is not None and inm == etag) or (inm is None and ims is not None and ims == modified):
            return Reply(304, b"", headers)
        return Reply(200, path, headers)

    def _send(self, h: BaseHTTPRequestHandler, req: Request, reply: Reply) -> None:
        """Log and write the reply; a file body honours Range when `ranges` is on."""
        status, headers, body = reply.status, dict(reply.headers), reply.body
        start, stop = 0, len(body) if isinstance(body, bytes) else body.stat().st_size
        size = stop
        if status == 200 and self.ranges and "range" in req.headers:
            span = _parse_range(req.headers["range"], size)
            if span is None:
                status, stop, body = 416, 0, b""
                headers["Content-Range"] = f"bytes */{size}"
            else:
                status, (start, stop) = 206, span
                headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        if status == 304 or req.method == "HEAD" and status >= 300:
            start = stop = 0
        close = not self.lengths and status not in (204, 304)
        record = Record(req.method, req.path, req.headers, status, 0)
        with self._lock:
            self.log.append(record)
        try:
            self._write(h, req, record, headers, (body, start, stop), close)
        except OSError:   # the client read what it needed and hung up
            h.close_connection = True

    def _write(self, h: BaseHTTPRequestHandler, req: Request, record: Record, headers: dict[str, str],
               span: tuple[bytes | Path, int, int], close: bool) -> None:
        body, start, stop = span
        status = record.status
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if close:
            h.send_header("Connection", "close")
            h.close_connection = True
        elif status != 304:
            h.send_header("Content-Length", str(stop - start))
        h.end_headers()
        if req.method == "HEAD":
            return
        for chunk in _chunks(body, start, stop):
            with self._lock:
                record.body_bytes += len(chunk)
            h.wfile.write(chunk)
        h.wfile.flush()


def _chunks(body: bytes | Path, start: int, stop: int) -> Iterator[bytes]:
    if isinstance(body, bytes):
        for pos in range(start, stop, CHUNK):
            yield body[pos:min(stop, pos + CHUNK)]
        return
    with open(body, "rb") as f:
        f.seek(start)
        pos = start
        while pos < stop:
            data = f.read(min(CHUNK, stop - pos))
            if not data:
                return
            pos += len(data)
            yield data


class ServerPool:
    """Servers started for one test and all stopped after it (the `http_servers` fixture)."""

    def __init__(self) -> None:
        self.servers: list[LoopbackServer] = []

    def start(self, **options: Any) -> LoopbackServer:
        server = LoopbackServer(**options)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
