"""Byte sources under the header reader, against real HTTP servers on 127.0.0.1.

Bounds come from the issue: a remote header costs at most its own size plus one initial chunk
(INITIAL_CHUNK, 256 KiB), which for files of 10 GiB and more is at most 0.1 % of the file; a
second read through the header cache is one conditional request answered 304, without a body.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from planner.core.errors import BadInput, GGUFError
from planner.core.units import GiB, KiB
from planner.gguf.location import open_source
from planner.gguf.reader import read_model
from planner.gguf.remote import HeaderCache, HTTPSource
from planner.gguf.source import INITIAL_CHUNK
from planner.gguf.tensor_data import TensorData
from planner.system import http, net
from tests.support.http_server import Redirect


def _same_model(a, b) -> None:
    assert (a.architecture, a.version, a.header_bytes) == (b.architecture, b.version, b.header_bytes)
    assert a.tensors == b.tensors
    assert a.metadata == b.metadata
    assert a.header_sha256 == b.header_sha256


@pytest.mark.parametrize("name", ["llama-70b", "gemma2-9b"])
def test_a_url_reads_as_the_local_file_for_a_header_and_a_chunk(name, remote_models, http_servers, net_sandbox):
    path = remote_models[name]
    srv = http_servers.start()
    url = srv.serve_file(f"/{name}.gguf", path)
    local = read_model(path)
    remote = read_model(url)
    _same_model(remote, local)
    assert remote.path == url and remote.remote and not remote.has_weights
    size = path.stat().st_size
    served = srv.body_bytes()
    assert local.header_bytes <= served <= local.header_bytes + INITIAL_CHUNK
    if size >= 10 * GiB:
        assert served <= size / 1000
    assert srv.requests() <= 16
    assert all(r.status == 206 for r in srv.log)


def test_the_second_read_is_one_request_without_a_body(remote_models, http_servers, net_sandbox):
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", remote_models["llama-70b"])
    first = read_model(url)
    srv.reset()
    again = read_model(url)
    _same_model(again, first)
    assert [(r.status, r.body_bytes) for r in srv.log] == [(304, 0)]
    assert "if-none-match" in srv.log[0].headers


def test_a_changed_file_is_read_again(tmp_path, http_servers, net_sandbox):
    from planner.synth.gguf_factory import llama_spec

    [path] = llama_spec(n_layer=2).write(tmp_path / "m.gguf")
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", path)
    assert read_model(url).metadata["llama.block_count"] == 2
    [path] = llama_spec(n_layer=3).write(tmp_path / "m.gguf")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # a new ETag and Last-Modified
    srv.reset()
    assert read_model(url).metadata["llama.block_count"] == 3
    assert srv.log[0].status == 206 and srv.log[0].body_bytes > 0


def test_the_cache_is_bounded_and_evicts_the_least_recently_used(tmp_path):
    cache = HeaderCache(tmp_path / "c", limit=3000)
    v = http.Validators(etag='"e"')
    for name in ("a", "b"):
        cache.put(f"http://h/{name}", b"x" * 1000, 10**9, v)
    assert cache.get("http://h/a") is not None     # a is now more recent than b
    os.utime(tmp_path / "c" / f"{cache._key('http://h/b')}.json", (1, 1))
    cache.put("http://h/c", b"x" * 1000, 10**9, v)  # a, b, c and their descriptions exceed 3000 bytes
    assert cache.get("http://h/b") is None
    assert cache.get("http://h/a") is not None and cache.get("http://h/c") is not None
    assert not [p for p in (tmp_path / "c").iterdir() if p.suffix not in (".json", ".header")]


def test_the_cache_keeps_nothing_without_validators_or_larger_than_its_bound(tmp_path):
    cache = HeaderCache(tmp_path / "c", limit=100)
    cache.put("http://h/a", b"x" * 10, 10, http.Validators())
    cache.put("http://h/b", b"x" * 101, 101, http.Validators(etag='"e"'))
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").iterdir())


def test_a_cache_entry_is_itself_a_header_only_model(remote_models, http_servers, net_sandbox):
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", remote_models["llama-70b"])
    remote = read_model(url)
    [entry] = list(net_sandbox.header_cache.glob("*.header"))
    saved = read_model(entry)
    assert saved.tensors == remote.tensors and saved.header_sha256 == remote.header_sha256
    assert not saved.has_weights


def test_redirects_to_storage_keep_the_token_at_home(remote_models, http_servers, net_sandbox):
    storage = http_servers.start()
    front = http_servers.start(token="s3cret")
    target = storage.serve_file("/blob/llama", remote_models["llama-70b"])
    url = front.mount("/org/repo/resolve/main/llama.gguf", Redirect(target))
    with net.use(net.overridden(hf_endpoint=front.base_url, token="s3cret")):
        model = read_model(url)
    assert model.architecture == "llama"
    assert all(r.headers.get("authorization") == "Bearer s3cret" for r in front.log)
    assert storage.log and not any("authorization" in r.headers for r in storage.log)
    # after the first answer, the ranges go straight to storage: one round trip each
    assert [r.status for r in front.log] == [302] and len(storage.log) > 1


def test_a_storage_address_that_stops_answering_falls_back_to_the_url(tmp_path, http_servers, net_sandbox):
    from planner.synth.gguf_factory import add_tokenizer, llama_spec

    spec = llama_spec()
    add_tokenizer(spec, 100000)   # a header of more than one chunk
    [path] = spec.write(tmp_path / "m.gguf")
    storage = http_servers.start()
    front = http_servers.start()
    signed = storage.serve_file("/signed", path)
    url = front.mount("/m.gguf", Redirect(signed))
    with HTTPSource(url) as source:
        source.prefix(1)
        storage.token = "expired"      # the signed address now answers 401 ...
        storage.mount("/fresh", path, protected=False)
        front.mount("/m.gguf", Redirect(storage.url("/fresh")))   # ... and the URL signs a new one
        assert len(source.prefix(INITIAL_CHUNK + 10)) >= INITIAL_CHUNK + 10
    assert [r.path for r in storage.log] == ["/signed", "/signed", "/fresh"]


def test_without_range_the_stream_stops_at_the_header(remote_models, http_servers, net_sandbox):
    path = remote_models["llama-70b"]
    srv = http_servers.start(ranges=False)
    url = srv.serve_file("/m.gguf", path)
    with net.use(net.overridden(header_cache_bytes=0)), HTTPSource(url) as source:
        model = read_model(url)
        source.prefix(1)
    _same_model(model, read_model(path))
    header = model.header_bytes
    # one 200 per read, each dropped near the header's end: the server wrote at most what the
    # client took plus the sockets' buffers, never the 40 GiB behind it
    assert [r.status for r in srv.log] == [200, 200]
    assert srv.log[0].body_bytes < header + 64 * 2**20
    assert source.bytes_received == INITIAL_CHUNK


def test_the_header_cap_refuses_a_header_in_one_line(remote_models, http_servers, net_sandbox):
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", remote_models["llama-70b"])
    with net.use(net.overridden(header_cap_bytes=1024 * KiB)), pytest.raises(BadInput) as e:
        read_model(url)
    assert "larger than the 1.00 MiB cap" in str(e.value) and "\n" not in str(e.value)
    assert srv.body_bytes() <= 1024 * KiB


def test_a_hostile_length_is_refused_before_it_is_fetched(tmp_path, http_servers, net_sandbox):
    raw = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 5) + b"hello" + struct.pack("<I", 8)
    raw += struct.pack("<Q", 30 * 2**30)   # a string value of 30 GiB in a file of a few bytes... served as 40 GiB
    path = tmp_path / "hostile.gguf"
    path.write_bytes(raw)
    os.truncate(path, 40 * GiB)
    srv = http_servers.start()
    url = srv.serve_file("/h.gguf", path)
    with pytest.raises(BadInput, match="cap"):
        read_model(url)
    assert srv.body_bytes() <= net_sandbox.header_cap_bytes


def test_a_split_model_is_read_shard_by_shard_header_only(remote_models, http_servers, net_sandbox):
    first = remote_models["split"]
    srv = http_servers.start()
    for shard in sorted(first.parent.glob("llama-70b-split-*")):
        srv.serve_file(f"/{shard.name}", shard)
    model = read_model(srv.url(first.name))
    local = read_model(first)
    assert model.tensors == local.tensors and len(model.shard_paths) == 3
    for shard in sorted(first.parent.glob("llama-70b-split-*")):
        assert srv.body_bytes(f"/{shard.name}") <= read_model_header(shard) + INITIAL_CHUNK


def read_model_header(shard: Path) -> int:
    from planner.gguf.reader import read_header_bytes

    return len(read_header_bytes(str(shard)).data)


def test_a_missing_shard_is_named(remote_models, http_servers, net_sandbox):
    first = remote_models["split"]
    srv = http_servers.start()
    srv.serve_file(f"/{first.name}", first)
    with pytest.raises(GGUFError, match=r"missing shard 2 of 3: http://127\.0\.0\.1:\d+/llama-70b-split-00002"):
        read_model(srv.url(first.name))


def test_header_only_files_plan_but_hold_no_weights(tmp_path, remote_models):
    full = read_model(remote_models["llama-70b"])
    cut = tmp_path / "m.header.gguf"
    with open(remote_models["llama-70b"], "rb") as f:
        cut.write_bytes(f.read(full.header_bytes - 3))   # even without all its alignment padding
    model = read_model(cut)
    assert model.tensors == full.tensors and not model.has_weights and full.has_weights
    assert model.header_sha256 == full.header_sha256
    with pytest.raises(BadInput, match="reading tensor data needs the weights, and this is a header-only file"):
        TensorData(model)


def test_a_url_model_refuses_tensor_reads(remote_models, http_servers, net_sandbox):
    srv = http_servers.start()
    model = read_model(srv.serve_file("/m.gguf", remote_models["llama-70b"]))
    with pytest.raises(BadInput, match="read over HTTP"):
        TensorData(model)


def test_a_local_source_maps_the_whole_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    with open_source(str(path)) as s:
        assert (s.size, s.remote, s.read(3, 4)) == (10, False, b"3456")


def test_the_stored_login_token_is_a_fallback(tmp_path):
    home = tmp_path / "hf"
    home.mkdir()
    (home / "token").write_text("hf_stored\n")
    env = {"HF_HOME": str(home)}
    assert net.from_environment(env).token == "hf_stored"
    assert net.from_environment({**env, "HF_TOKEN": "hf_env"}).token == "hf_env"
    assert net.from_environment({"HF_HOME": str(tmp_path / "none")}).token is None
    assert net.from_environment({"MODEL_ENDPOINT": "http://a/", "HF_ENDPOINT": "http://b"}).hf_endpoint == "http://a"


def test_the_proxy_environment_is_honoured(tmp_path, http_servers, net_sandbox, monkeypatch):
    import socket

    from planner.synth.gguf_factory import llama_spec

    [path] = llama_spec().write(tmp_path / "m.gguf")
    proxy = http_servers.start()
    proxy.serve_file("/m.gguf", path)
    with socket.socket() as s:   # a port nothing listens on: the model is reachable only through the proxy
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/m.gguf"
    monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
    assert read_model(url).architecture == "llama"
    assert proxy.requests("/m.gguf") >= 1
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with pytest.raises(BadInput, match="cannot connect"):
        read_model(url)


@pytest.mark.parametrize("validators,cached", [
    ({"etags": False}, "if-modified-since"),           # Last-Modified alone revalidates
    ({"last_modified": False}, "if-none-match"),       # so does an ETag alone
    ({"etags": False, "last_modified": False}, None),  # nothing to revalidate with: nothing cached
])
def test_revalidation_uses_what_the_server_gives(validators, cached, tmp_path, http_servers, net_sandbox):
    from planner.synth.gguf_factory import llama_spec

    [path] = llama_spec().write(tmp_path / "m.gguf")
    srv = http_servers.start(**validators)
    url = srv.serve_file("/m.gguf", path)
    read_model(url)
    assert srv.log[0].headers["accept-encoding"] == "identity"
    srv.reset()
    read_model(url)
    first = srv.log[0]
    if cached:
        assert (first.status, first.body_bytes) == (304, 0) and cached in first.headers
    else:
        assert first.status == 206 and first.body_bytes > 0
        assert not any(k.startswith("if-") for k in first.headers)


def test_a_range_answer_without_a_total_size_reads_within_the_cap(tmp_path, http_servers, net_sandbox):
    """`Content-Range: bytes a-b/*` (RFC 9110 allows an unknown length): the header is read, bounded
    by the header cap instead of the file's size."""
    from planner.synth.gguf_factory import add_tokenizer, llama_spec
    from tests.support.http_server import Reply

    spec = llama_spec()
    add_tokenizer(spec, 50000)
    [path] = spec.write(tmp_path / "m.gguf")
    data = path.read_bytes()

    def unknown_total(req):
        start, _, stop = req.headers["range"].removeprefix("bytes=").partition("-")
        chunk = data[int(start):int(stop) + 1]
        return Reply(206, chunk, {"Content-Range": f"bytes {start}-{int(start) + len(chunk) - 1}/*", "ETag": '"x"'})

    srv = http_servers.start(ranges=False)   # the handler answers the ranges itself
    model = read_model(srv.mount("/m.gguf", unknown_total))
    assert model.tensors == read_model(path).tensors


def test_a_compressed_range_is_refused(tmp_path, http_servers, net_sandbox):
    from tests.support.http_server import Reply

    srv = http_servers.start(ranges=False)
    url = srv.mount("/m.gguf", lambda req: Reply(200, b"\x1f\x8b" + bytes(100), {"Content-Encoding": "gzip"}))
    with pytest.raises(BadInput, match="gzip-encoded though identity was asked for"):
        read_model(url)


def test_an_entry_evicted_mid_read_is_read_afresh(tmp_path, http_servers, net_sandbox):
    from planner.synth.gguf_factory import llama_spec

    [path] = llama_spec().write(tmp_path / "m.gguf")
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", path)
    read_model(url)
    srv.reset()
    with open_source(url) as source:   # it found the entry ...
        for data in net_sandbox.header_cache.glob("*.header"):
            data.unlink()              # ... which another process evicts before the 304 arrives
        assert bytes(source.prefix(4)[:4]) == b"GGUF"
    assert [r.status for r in srv.log] == [304, 206]
