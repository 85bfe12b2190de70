"""`fitplan fetch-header MODEL -o model.header.gguf`: a header-only file that plans as the model
does, offline; what needs the weights (validate) says so in one line. sd-fit reads header-only
safetensors files and URLs the same way."""
from __future__ import annotations

import json

from planner.cli import main
from planner.gguf.reader import read_model
from planner.synth.safetensors_factory import write_safetensors
from planner.synth.tiny_models import write_tiny

PLAN = ["plan", "--device", "CUDA0=24GiB", "--ram", "64GiB", "--format", "json"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _plan(capsys, model: str) -> dict:
    code, out, err = run(capsys, PLAN[0], model, *PLAN[1:])
    assert code == 0, err
    return json.loads(out.replace(model, "MODEL"))


def test_a_header_from_a_url_plans_offline_as_the_model(capsys, tmp_path, remote_models, http_servers, net_sandbox):
    path = remote_models["llama-70b"]
    srv = http_servers.start()
    url = srv.serve_file("/llama-70b.gguf", path)
    out = tmp_path / "llama-70b.header.gguf"
    code, text, err = run(capsys, "fetch-header", url, "-o", str(out), "--format", "json")
    assert code == 0, err
    doc = json.loads(text)
    full = read_model(path)
    assert doc["written"] == [str(out)] and doc["header_bytes"] == full.header_bytes == out.stat().st_size
    assert doc["model_bytes"] == full.total_tensor_bytes
    assert srv.body_bytes() <= full.header_bytes + 256 * 1024
    srv.close()   # offline from here on
    header_only = read_model(out)
    assert not header_only.has_weights and header_only.header_sha256 == full.header_sha256
    assert _plan(capsys, str(out)) == _plan(capsys, str(path))


def test_a_split_model_is_written_shard_by_shard(capsys, tmp_path, remote_models, http_servers, net_sandbox):
    first = remote_models["split"]
    srv = http_servers.start()
    for shard in first.parent.glob("llama-70b-split-*"):
        srv.serve_file(f"/{shard.name}", shard)
    code, text, err = run(capsys, "fetch-header", srv.url(first.name), "-o", str(tmp_path / "s.gguf"),
                          "--format", "json")
    assert code == 0, err
    written = json.loads(text)["written"]
    assert written == [str(tmp_path / f"s-0000{i}-of-00003.gguf") for i in (1, 2, 3)]
    assert read_model(written[0]).tensors == read_model(first).tensors


def test_the_table_names_what_was_written(capsys, tmp_path):
    model = write_tiny(tmp_path / "tiny.gguf", "llama")
    code, text, err = run(capsys, "fetch-header", str(model), "-o", str(tmp_path / "t.header.gguf"))
    assert code == 0, err
    assert "t.header.gguf" in text and "weights left out" in text


def test_validate_needs_the_weights_in_one_line(capsys, tmp_path):
    model = write_tiny(tmp_path / "tiny.gguf", "llama")
    header = tmp_path / "tiny.header.gguf"
    assert run(capsys, "fetch-header", str(model), "-o", str(header))[0] == 0
    code, _, err = run(capsys, "validate", str(header), "--", "-c", "256", "-ngl", "0")
    assert code == 2
    [line] = err.strip().splitlines()
    assert "validate needs the weights" in line and "header-only" in line
    # sizing alone reads no weight: --reserve-only accepts the header
    code, _, err = run(capsys, "validate", str(header), "--reserve-only", "--", "-c", "256", "-ngl", "0")
    assert code in (0, 1), err


def test_validate_refuses_a_url(capsys, tmp_path, http_servers, net_sandbox):
    model = write_tiny(tmp_path / "tiny.gguf", "llama")
    srv = http_servers.start()
    code, _, err = run(capsys, "validate", srv.serve_file("/tiny.gguf", model), "--", "-c", "256", "-ngl", "0")
    assert code == 2
    [line] = err.strip().splitlines()
    assert "read over HTTP" in line


def test_a_missing_output_directory_is_one_line(capsys, tmp_path):
    model = write_tiny(tmp_path / "tiny.gguf", "llama")
    code, _, err = run(capsys, "fetch-header", str(model), "-o", str(tmp_path / "no" / "x.gguf"))
    assert code == 2 and len(err.strip().splitlines()) == 1


def _safetensors(path, with_data: bool) -> str:
    tensors = {"model.diffusion_model.double_blocks.0.img_attn.qkv.weight": ("F16", [64, 1024, 1024])}
    return str(write_safetensors(path, tensors, data=with_data))


def test_sd_fit_reads_a_header_only_safetensors_and_a_url(capsys, tmp_path, http_servers, net_sandbox):
    full = _safetensors(tmp_path / "m.safetensors", with_data=True)
    bare = _safetensors(tmp_path / "m.header.safetensors", with_data=False)
    srv = http_servers.start()
    url = srv.serve_file("/m.safetensors", full)
    outs = []
    for model in (full, bare, url):
        code, out, err = run(capsys, "sd-fit", model, "--device", "CUDA0=8GiB", "--ram", "32GiB", "--format", "json")
        assert code == 0, err
        outs.append(json.loads(out.replace(model, "MODEL")))
    assert outs[0] == outs[1] == outs[2]
    assert srv.body_bytes() <= 256 * 1024   # one first chunk holds this header


def test_inspect_estimate_and_sweep_read_a_header_only_file_as_the_model(capsys, tmp_path):
    model = str(write_tiny(tmp_path / "tiny.gguf", "llama"))
    header = str(tmp_path / "tiny.header.gguf")
    assert run(capsys, "fetch-header", model, "-o", header)[0] == 0
    for argv in (["inspect", "{m}", "--format", "json"],
                 ["estimate", "{m}", "--format", "json", "--", "-c", "256", "-ngl", "0"],
                 ["sweep", "{m}", "--vary", "ctx=256,512", "--", "-ngl", "0"]):
        outs = []
        for m in (model, header):
            code, out, err = run(capsys, *[a.format(m=m) for a in argv])
            assert code == 0, err
            outs.append(out.replace(m, "MODEL"))
        assert outs[0] == outs[1], argv[0]
