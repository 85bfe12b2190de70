"""`fitplan plan http://...`: the same plan as the local file, read for a header's worth of bytes;
every network failure one line on stderr and exit 2. Real servers on 127.0.0.1, no mocks."""
from __future__ import annotations

import json
import socket
import time

import pytest

from planner.cli import main
from planner.gguf.reader import read_model
from planner.gguf.source import INITIAL_CHUNK
from tests.support.http_server import Redirect, Reply

PLAN = ["--device", "CUDA0=24GiB", "--ram", "64GiB"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _plan_json(capsys, model: str, *pre: str) -> dict:
    code, out, err = run(capsys, *pre, "plan", model, *PLAN, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    doc.pop("model_path", None)
    return doc


def test_a_70b_plan_over_http_is_the_local_plan(capsys, remote_models, http_servers, net_sandbox):
    path = remote_models["llama-70b"]
    srv = http_servers.start()
    url = srv.serve_file("/llama-70b.gguf", path)
    local = _plan_json(capsys, str(path))
    remote = _plan_json(capsys, url)
    assert remote["flags"] == local["flags"] and remote["devices"] == local["devices"]
    # everything else too, once the model's name is the same (llama-bench's -m, the model entry);
    # llama-server takes a URL as -mu
    assert remote["argv"][:2] == ["-mu", url]
    assert json.loads(json.dumps(remote).replace('"-mu", ', '"-m", ').replace(url, str(path))) == local
    header = read_model(path).header_bytes
    assert srv.body_bytes() <= header + INITIAL_CHUNK <= path.stat().st_size / 1000
    # and again: the header cache answers, the server sends no body
    srv.reset()
    assert _plan_json(capsys, url)["flags"] == local["flags"]
    assert srv.requests() >= 1 and srv.body_bytes() == 0 and {r.status for r in srv.log} == {304}


def test_table_output_names_the_url(capsys, remote_models, http_servers, net_sandbox):
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", remote_models["gemma2-9b"])
    code, out, err = run(capsys, "inspect", url)
    assert code == 0, err
    assert "blk.0" in out or "layer" in out.lower()


def _one_line_error(capsys, argv: list[str], *fragments: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fitplan: error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_not_found_is_one_line(capsys, http_servers, net_sandbox):
    srv = http_servers.start()
    _one_line_error(capsys, ["plan", srv.url("/nope.gguf"), *PLAN], "/nope.gguf", "HTTP 404", "no such file")


@pytest.mark.parametrize("status", [401, 403])
def test_refused_access_hints_at_the_token(capsys, http_servers, net_sandbox, status):
    srv = http_servers.start()
    srv.mount("/gated.gguf", lambda req: Reply(status, b"gated\n"))
    _one_line_error(capsys, ["plan", srv.url("/gated.gguf"), *PLAN], f"HTTP {status}", "HF_TOKEN", "--token-file")


def test_a_token_file_opens_a_gated_repository(capsys, tmp_path, remote_models, http_servers, net_sandbox):
    storage = http_servers.start()
    hub = http_servers.start(token="hf_abc")
    url = hub.mount("/org/repo/resolve/main/m.gguf",
                    Redirect(storage.serve_file("/xet/m", remote_models["gemma2-9b"])))
    _one_line_error(capsys, ["--hf-endpoint", hub.base_url, "plan", url, *PLAN], "HTTP 401", "HF_TOKEN")
    token = tmp_path / "token"
    token.write_text("\nhf_abc\n")
    code, _, err = run(capsys, "--hf-endpoint", hub.base_url, "--token-file", str(token), "plan", url, *PLAN,
                       "--format", "flags")
    assert code == 0, err
    assert not any("authorization" in r.headers for r in storage.log)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_one_line(capsys, net_sandbox):
    port = _closed_port()
    _one_line_error(capsys, ["plan", f"http://127.0.0.1:{port}/m.gguf", *PLAN],
                    f"cannot connect to 127.0.0.1:{port}", "refused")


def test_a_timeout_is_one_line(capsys, http_servers, net_sandbox, monkeypatch):
    srv = http_servers.start()

    def slow(req):
        time.sleep(1.5)
        return Reply(200, b"GGUF")

    srv.mount("/slow.gguf", slow)
    monkeypatch.setenv("FITPLAN_HTTP_RETRIES", "0")
    t0 = time.perf_counter()
    _one_line_error(capsys, ["--http-timeout", "0.3", "plan", srv.url("/slow.gguf"), *PLAN],
                    "did not answer within 0.3 s")
    assert time.perf_counter() - t0 < 1.5


def test_a_tls_error_is_one_line(capsys, http_servers, net_sandbox):
    srv = http_servers.start()   # plain HTTP, spoken to as HTTPS: the handshake fails
    _one_line_error(capsys, ["plan", f"https://127.0.0.1:{srv.port}/m.gguf", *PLAN], "TLS error")


def test_no_range_and_no_length_is_one_line(capsys, remote_models, http_servers, net_sandbox):
    srv = http_servers.start(ranges=False, lengths=False)
    url = srv.serve_file("/m.gguf", remote_models["gemma2-9b"])
    _one_line_error(capsys, ["plan", url, *PLAN], "neither Range requests nor Content-Length")


def test_no_range_with_a_length_still_plans(capsys, remote_models, http_servers, net_sandbox):
    srv = http_servers.start(ranges=False)
    url = srv.serve_file("/m.gguf", remote_models["gemma2-9b"])
    code, _, err = run(capsys, "plan", url, *PLAN, "--format", "flags")
    assert code == 0, err


def test_a_header_over_the_cap_is_one_line(capsys, remote_models, http_servers, net_sandbox, monkeypatch):
    srv = http_servers.start()
    url = srv.serve_file("/m.gguf", remote_models["gemma2-9b"])
    monkeypatch.setenv("FITPLAN_HEADER_CAP_MIB", "1")
    _one_line_error(capsys, ["plan", url, *PLAN], "larger than the 1.00 MiB cap", "FITPLAN_HEADER_CAP_MIB")


def test_server_errors_are_retried(capsys, remote_models, http_servers, net_sandbox, monkeypatch):
    monkeypatch.setenv("FITPLAN_HTTP_RETRIES", "2")
    srv = http_servers.start()
    path = remote_models["gemma2-9b"]
    answers = iter([Reply(503, b"busy"), Reply(429, b"slow down", {"Retry-After": "0"})])

    def flaky(req):
        return next(answers, None) or Reply(200, path)

    url = srv.mount("/m.gguf", flaky)
    code, _, err = run(capsys, "plan", url, *PLAN, "--format", "flags")
    assert code == 0, err
    assert [r.status for r in srv.log][:3] == [503, 429, 206]


def test_bad_network_options_are_one_line(capsys, tmp_path, net_sandbox):
    _one_line_error(capsys, ["--hf-endpoint", "huggingface.co", "plan", "m.gguf", *PLAN], "--hf-endpoint",
                    "http:// or https://")
    _one_line_error(capsys, ["--token-file", str(tmp_path / "none"), "plan", "m.gguf", *PLAN], "--token-file")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    _one_line_error(capsys, ["--token-file", str(empty), "plan", "m.gguf", *PLAN], "holds no token")
    _one_line_error(capsys, ["--http-timeout", "0", "plan", "m.gguf", *PLAN], "--http-timeout")


def test_a_server_that_stays_down_is_one_line(capsys, http_servers, net_sandbox):
    srv = http_servers.start()
    srv.mount("/m.gguf", lambda req: Reply(503, b"down"))
    _one_line_error(capsys, ["plan", srv.url("/m.gguf"), *PLAN], "HTTP 503")
    assert srv.requests() == 2   # FITPLAN_HTTP_RETRIES=1: the request and one retry


def test_a_redirect_loop_is_one_line(capsys, http_servers, net_sandbox):
    srv = http_servers.start()
    srv.mount("/a", Redirect(srv.url("/b")))
    srv.mount("/b", Redirect(srv.url("/a")))
    _one_line_error(capsys, ["plan", srv.url("/a"), *PLAN], "more than 10 redirects")
