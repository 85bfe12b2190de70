"""A model location to its byte source: a local path, or an http(s) URL."""
from __future__ import annotations

from planner.gguf.source import ByteSource, FileSource, is_url


def open_source(location: str) -> ByteSource:
    """The source for a model location: an http(s) URL (planner.gguf.remote: Range requests through
    the header cache), or a local path (a memory map)."""
    if is_url(location):
        # imported here so that reading a local file never loads httpx (~160 ms of a 1 s inspect)
        from planner.gguf.remote import open_remote

        return open_remote(location)
    return FileSource(location)
