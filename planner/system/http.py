"""The one HTTP client: every network read fitplan makes goes through here.

Built from `planner.system.net.current()`: its timeout, its retries (exponential backoff on
connection errors, 5xx and 429 — a 429's Retry-After honoured up to MAX_RETRY_AFTER_S, and one
asking for longer refused at once), its token. `trust_env` keeps HTTPS_PROXY / NO_PROXY /
SSL_CERT_FILE working; `Accept-Encoding: identity` keeps byte offsets byte offsets (a gzipped
body would make a Range answer meaningless). Redirects are followed here rather than by httpx so
that the bearer token is sent only to the host the request was addressed to: Hugging Face answers
a file request with a redirect to a storage host, which must never see the token.

Every failure becomes one `RemoteError` line (a `BadInput`, exit 2) that names the URL the caller
asked for, never a signed redirect target.
"""
from __future__ import annotations

import json
import logging
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from planner.core.errors import RemoteError
from planner.system import net

log = logging.getLogger(__name__)

USER_AGENT = "fitplan"
MAX_REDIRECTS = 10
BACKOFF_BASE_S = 0.25            # first retry after 0.25 s, then 0.5 s, 1 s, ...
MAX_RETRY_AFTER_S = 10.0         # a 429's Retry-After is honoured up to this
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
TOKEN_HINT = "set HF_TOKEN or pass --token-file (the repository may be gated or private)"

# what httpx's trust_env reads when a client is made: a client is reused only while they stand
PROXY_ENVIRONMENT = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")
_clients: dict[tuple[object, ...], httpx.Client] = {}


def client() -> httpx.Client:
    """The shared httpx client for the current settings (one per timeout and proxy environment;
    reused across calls). Redirects are not followed by it: `request` follows them (see the
    module docstring)."""
    settings = net.current()
    key = (settings.timeout_s, *(os.environ.get(k) or os.environ.get(k.lower()) for k in PROXY_ENVIRONMENT))
    if key not in _clients:
        _clients[key] = httpx.Client(
            timeout=httpx.Timeout(settings.timeout_s), follow_redirects=False, trust_env=True,
            headers={"Accept-Encoding": "identity", "User-Agent": USER_AGENT})
    return _clients[key]


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    """scheme, host and port: what a token is bound to (another port on the same host is another server)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def token_for(url: str) -> str | None:
    """The bearer token for `url`: the settings' token, sent only to the Hugging Face or ModelScope
    endpoint (same scheme, host and port; llama.cpp sends HF_TOKEN to the Hub alone). A token is
    never sent to an arbitrary server because HF_TOKEN happens to be set."""
    settings = net.current()
    if not settings.token:
        return None
    origins = {_origin(settings.hf_endpoint), _origin(settings.ms_endpoint)}
    return settings.token if _origin(url) in origins else None


def _tls_problem(e: BaseException) -> str | None:
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return getattr(seen, "reason", None) or str(seen)
        seen = seen.__cause__ or seen.__context__
    text = str(e)
    return text if ("SSL" in text or "CERTIFICATE" in text.upper()) else None


def _transport_error(url: str, e: httpx.TransportError) -> RemoteError:
    host = urlsplit(url).netloc or url
    tls = _tls_problem(e) if isinstance(e, httpx.ConnectError) else None
    if tls:
        return RemoteError(url, f"TLS error talking to {host}: {tls} "
                                f"(a private CA goes in SSL_CERT_FILE)")
    if isinstance(e, httpx.TimeoutException):
        return RemoteError(url, f"{host} did not answer within {net.current().timeout_s:g} s "
                                f"(FITPLAN_HTTP_TIMEOUT)")
    if isinstance(e, httpx.ConnectError):
        reason = str(e).split("] ")[-1] or "connection failed"
        return RemoteError(url, f"cannot connect to {host}: {reason}")
    if isinstance(e, httpx.UnsupportedProtocol):
        return RemoteError(url, "not an http:// or https:// URL")
    return RemoteError(url, f"transfer from {host} failed: {type(e).__name__}: {e}")


def _status_error(url: str, resp: httpx.Response) -> RemoteError:
    code = resp.status_code
    phrase = f"HTTP {code} {resp.reason_phrase}".rstrip()
    if code in (401, 403):
        return RemoteError(url, f"{phrase}: {TOKEN_HINT}", status=code)
    if code == 404:
        return RemoteError(url, f"{phrase}: no such file", status=code)
    if code == 416:
        return RemoteError(url, f"{phrase}: the server refused the byte range", status=code)
    return RemoteError(url, phrase, status=code)


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (the delay-seconds form; an HTTP date is not honoured)."""
    value = (value or "").strip()
    return float(value) if value.isdigit() else None


def rate_limit_problem(status: int, retry_after: float | None) -> str | None:
    """Why a 429 is not worth waiting for: its Retry-After asks for longer than MAX_RETRY_AFTER_S
    (a wait of minutes would only hang the command); None when it may be retried."""
    if status != 429 or retry_after is None or retry_after <= MAX_RETRY_AFTER_S:
        return None
    return (f"HTTP 429: rate limited; the server asks to wait {retry_after:g} s, more than the "
            f"{MAX_RETRY_AFTER_S:g} s fitplan waits: try again later")


def _delay(attempt: int, resp: httpx.Response | None) -> float:
    delay = BACKOFF_BASE_S * 2 ** attempt
    if resp is not None and resp.status_code == 429:
        after = retry_after_s(resp.headers.get("Retry-After"))
        if after is not None:
            delay = max(delay, min(after, MAX_RETRY_AFTER_S))
    return delay


def _send_once(method: str, url: str, headers: Mapping[str, str]) -> httpx.Response:
    """One request with its redirects followed; the token only ever goes to the first URL's origin."""
    c = client()
    origin = _origin(url)
    token = token_for(url)
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        h = dict(headers)
        if token and _origin(target) == origin:
            h["Authorization"] = f"Bearer {token}"
        resp = c.send(c.build_request(method, target, headers=h), stream=True)
        if resp.status_code not in REDIRECT_STATUSES or "location" not in resp.headers:
            return resp
        resp.close()
        target = str(resp.url.join(resp.headers["location"]))
        log.debug("%s redirected to %s", url, urlsplit(target).netloc)
    raise RemoteError(url, f"more than {MAX_REDIRECTS} redirects")


def request(method: str, url: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
    """A streamed response whose status is 2xx or 304 (the caller closes it); retried with backoff
    on connection errors, timeouts, 5xx and 429; any other outcome is a one-line RemoteError."""
    retries = max(0, net.current().retries)
    for attempt in range(retries + 1):
        last = attempt == retries
        try:
            resp = _send_once(method, url, headers or {})
        except httpx.TransportError as e:
            retryable = isinstance(e, (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError))
            if last or not retryable or _tls_problem(e):
                raise _transport_error(url, e) from None
            log.debug("%s: %s, retrying", url, e)
            time.sleep(_delay(attempt, None))
            continue
        too_long = rate_limit_problem(resp.status_code, retry_after_s(resp.headers.get("Retry-After")))
        if too_long:
            resp.close()
            raise RemoteError(url, too_long, status=429)
        if resp.status_code in RETRY_STATUSES and not last:
            resp.close()
            time.sleep(_delay(attempt, resp))
            continue
        if resp.status_code >= 400 or resp.status_code < 200:
            resp.close()
            raise _status_error(url, resp)
        return resp
    raise AssertionError("unreachable")  # pragma: no cover


def get_bytes(url: str, *, headers: Mapping[str, str] | None = None, limit: int | None = None) -> bytes:
    """A whole (small) body: a manifest, an API answer. More than `limit` bytes is refused."""
    resp = request("GET", url, headers)
    try:
        out = bytearray()
        try:
            for chunk in resp.iter_bytes():   # decoded, should a server compress anyway
                out += chunk
                if limit is not None and len(out) > limit:
                    raise RemoteError(url, f"the answer is larger than {limit} bytes")
        except httpx.TransportError as e:
            raise _transport_error(url, e) from None
        return bytes(out)
    finally:
        resp.close()


def get_json(url: str, *, headers: Mapping[str, str] | None = None) -> Any:
    """A JSON document (an API answer, an OCI manifest)."""
    body = get_bytes(url, headers={"Accept": "application/json", **(headers or {})}, limit=64 << 20)
    try:
        return json.loads(body)
    except ValueError:
        raise RemoteError(url, "the answer is not JSON") from None


@dataclass(frozen=True)
class Validators:
    """What identifies one version of a remote file: a revalidation sends them back."""

    etag: str | None = None
    last_modified: str | None = None

    def __bool__(self) -> bool:
        return bool(self.etag or self.last_modified)

    def conditional_headers(self) -> dict[str, str]:
        h = {}
        if self.etag:
            h["If-None-Match"] = self.etag
        if self.last_modified:
            h["If-Modified-Since"] = self.last_modified
        return h


def _total_size(resp: httpx.Response) -> int | None:
    """The file's full size: Content-Range's `/TOTAL` on a 206, Content-Length on a 200."""
    if resp.status_code == 206:
        total = resp.headers.get("content-range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else None
    length = resp.headers.get("content-length", "")
    return int(length) if resp.status_code == 200 and length.isdigit() else None


class RangeBody:
    """The answer to `open_range`: `status` 206 (the range asked for), 200 (the server ignored
    Range: the body is the whole file from byte 0, to be read only as far as needed) or 304
    (not modified: no body). `read(n)` returns up to n more body bytes, b'' at the end."""

    def __init__(self, url: str, resp: httpx.Response) -> None:
        self.url = url
        self.final_url = str(resp.url)   # where the redirects led: later ranges can go straight there
        self.status = resp.status_code
        self.size = _total_size(resp)
        self.validators = Validators(resp.headers.get("etag"), resp.headers.get("last-modified"))
        self._resp = resp
        self._chunks = resp.iter_raw()
        self._pending = b""

    @property
    def not_modified(self) -> bool:
        return self.status == 304

    @property
    def ranged(self) -> bool:
        return self.status == 206

    def read(self, n: int) -> bytes:
        out = bytearray(self._pending[:n])
        self._pending = self._pending[n:]
        try:
            while len(out) < n:
                chunk = next(self._chunks, b"")
                if not chunk:
                    break
                take = n - len(out)
                out += chunk[:take]
                self._pending = chunk[take:]
        except httpx.TransportError as e:
            raise _transport_error(self.url, e) from None
        return bytes(out)

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> RangeBody:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_range(url: str, start: int, stop: int, *, validators: Validators | None = None,
               headers: Mapping[str, str] | None = None) -> RangeBody:
    """GET bytes [start, stop) of `url` with a Range request; with `validators`, conditionally
    (If-None-Match / If-Modified-Since), so an unchanged file answers 304 with no body."""
    h = {"Range": f"bytes={start}-{stop - 1}", **(headers or {})}
    if validators:
        h.update(validators.conditional_headers())
    resp = request("GET", url, h)
    encoding = resp.headers.get("content-encoding", "identity").lower()
    if encoding not in ("identity", ""):   # offsets into a compressed body are not file offsets
        resp.close()
        raise RemoteError(url, f"the server sent the file {encoding}-encoded though identity was asked for")
    return RangeBody(url, resp)
