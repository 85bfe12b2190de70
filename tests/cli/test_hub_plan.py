"""`fitplan plan` from references: Hugging Face and ModelScope repositories on loopback fakes, a
3-shard split, an Ollama store laid out as Ollama lays it out; every failure one line, exit 2.

The fakes serve sparse GGUFs by Range (tests/support/fake_hub.py); the plan of a reference must
be the plan of the same file on disk.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.cli import main
from planner.synth.gguf_factory import llama_spec
from planner.system import net
from tests.support.fake_hub import (
    MODEL_MEDIA_TYPE,
    Hosts,
    OllamaLayer,
    dead_endpoint,
    hosted,
    settle,
    write_ollama_store,
)
from tests.support.overhead import cuda

# a card whose default budget holds the CUDA overhead and no more: the plans are the host's
DEVICES = ["--device", f"CUDA0={cuda(512)}", "--ram", "4GiB", "--ctx", "2048", "--format", "json"]
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def hosts(net_sandbox, http_servers, tmp_path, monkeypatch) -> Iterator[Hosts]:
    with hosted(http_servers, tmp_path, monkeypatch) as h:
        yield h


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def plan_of(capsys, model: str) -> dict:
    code, out, err = run(capsys, "plan", model, *DEVICES)
    assert code == 0, err
    return json.loads(out)


def same_plan(a: dict, b: dict) -> None:
    assert a["flags"] == b["flags"] and a["devices"] == b["devices"]


def write(hosts: Hosts, name: str, **kw) -> list[Path]:
    return llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(hosts.files / name, **kw)


def test_a_quant_tag_on_the_fake_hub_plans_as_the_local_file(hosts, capsys, tmp_path):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    [served] = write(hosts, "served-Q4_K_M.gguf")
    [other] = write(hosts, "served-Q8_0.gguf")
    hosts.hf.add("org/model-GGUF", {"model-Q8_0.gguf": other, "model-Q4_K_M.gguf": served}, commit=COMMIT)
    same_plan(plan_of(capsys, "hf://org/model-GGUF:Q4_K_M"), plan_of(capsys, str(local)))
    resolves = [r for r in settle(hosts.hf.server).records() if "/resolve/" in r.path]
    assert {r.path for r in resolves} == {f"/org/model-GGUF/resolve/{COMMIT}/model-Q4_K_M.gguf"}
    # only the header crossed the wire, never the tensor data
    assert settle(hosts.hf.server).body_bytes() < served.stat().st_size


def test_a_modelscope_reference_plans(hosts, capsys, tmp_path):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    [served] = write(hosts, "ms-Q4_K_M.gguf")
    hosts.ms.add("org/model-GGUF", {"Q4_K_M/model-Q4_K_M.gguf": served})
    same_plan(plan_of(capsys, "ms://org/model-GGUF:Q4_K_M"), plan_of(capsys, str(local)))
    assert settle(hosts.ms.server).requests("/models/org/model-GGUF/resolve/master/Q4_K_M/model-Q4_K_M.gguf") >= 1


def test_the_hubs_redirect_to_its_storage_host_is_followed(hosts, capsys, tmp_path, http_servers):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    [served] = write(hosts, "r-Q4_K_M.gguf")
    hosts.hf.storage = storage = http_servers.start()
    hosts.hf.add("org/model-GGUF", {"model-Q4_K_M.gguf": served}, commit=COMMIT)
    same_plan(plan_of(capsys, "hf://org/model-GGUF"), plan_of(capsys, str(local)))
    assert settle(storage).requests() >= 1 and 0 < storage.body_bytes() < served.stat().st_size


def test_a_three_shard_split_resolves_and_plans(hosts, capsys, tmp_path):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    shards = write(hosts, "big-Q4_K_M.gguf", shards=3)
    assert [p.name for p in shards] == [f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    hosts.hf.add("org/big-GGUF", {f"Q4_K_M/{p.name}": p for p in shards}, commit=COMMIT)
    same_plan(plan_of(capsys, "org/big-GGUF:Q4_K_M"), plan_of(capsys, str(local)))
    for p in shards:    # every shard's header read, none of its data
        path = f"/org/big-GGUF/resolve/{COMMIT}/Q4_K_M/{p.name}"
        assert settle(hosts.hf.server).requests(path) >= 1
        assert settle(hosts.hf.server).body_bytes(path) < p.stat().st_size


def test_an_ollama_name_plans_from_the_local_store(hosts, capsys, tmp_path):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    [blob] = write(hosts, "pulled.gguf")
    write_ollama_store(hosts.settings.ollama_models, "qwen3", "30b-a3b", [OllamaLayer(MODEL_MEDIA_TYPE, blob)])
    same_plan(plan_of(capsys, "ollama://qwen3:30b-a3b"), plan_of(capsys, str(local)))
    assert settle(hosts.ollama.server).requests() == 0


def test_an_ollama_name_not_pulled_plans_from_the_registry(hosts, capsys, tmp_path):
    [local] = llama_spec(n_layer=4, n_embd=512, n_ff=1024).write(tmp_path / "local.gguf")
    [blob] = write(hosts, "remote.gguf")
    layer = OllamaLayer(MODEL_MEDIA_TYPE, blob)
    hosts.ollama.add("qwen3", "8b", [layer])
    same_plan(plan_of(capsys, "ollama://qwen3:8b"), plan_of(capsys, str(local)))
    assert settle(hosts.ollama.server).body_bytes(f"/v2/library/qwen3/blobs/{layer.digest}") < blob.stat().st_size


@pytest.mark.parametrize("case, model, expected", [
    ("unknown repo", "hf://org/missing:Q4_K_M", "no repository org/missing on "),
    ("no such quant", "hf://org/model-GGUF:Q2_K", "no quant tag 'Q2_K' in org/model-GGUF@89abcdef0123; "
                                                 "quants available: Q4_K_M"),
    ("gated, no token", "hf://org/gated-GGUF", "org/gated-GGUF is a gated repository"),
    ("unknown Ollama model", "ollama://nosuch:1b", "no such Ollama model"),
    ("unknown scheme", "gs://bucket/model.gguf", "unknown scheme 'gs'"),
    ("dead endpoint", "hf://org/model-GGUF", "cannot reach the Hugging Face endpoint"),
])
def test_each_failure_is_one_line_and_exit_2(hosts, capsys, monkeypatch, case, model, expected):
    [served] = write(hosts, "m-Q4_K_M.gguf")
    hosts.hf.add("org/model-GGUF", {"model-Q4_K_M.gguf": served}, commit=COMMIT)
    hosts.hf.add("org/gated-GGUF", {"model-Q4_K_M.gguf": served}, gated=True)
    with net.use(net.overridden(hf_endpoint=dead_endpoint()) if case == "dead endpoint" else net.current()):
        code, out, err = run(capsys, "plan", model, "--device", f"CUDA0={cuda(512)}", "--ram", "4GiB")
    assert code == 2, err
    # the loopback server's own threads may print to stderr too (a client hanging up mid-answer)
    lines = [line for line in err.splitlines() if line.startswith("fitplan:")]
    assert len(lines) == 1 and lines[0].startswith("fitplan: error: ") and expected in lines[0], err
    if case == "gated, no token":
        assert "HF_TOKEN" in lines[0] and "--token-file" in lines[0]
