"""MODEL references: the precedence, Hugging Face / ModelScope repositories against loopback fakes,
the local caches (hub cache, LLAMA_CACHE) answering without a request, and Ollama's store and registry.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.registry import references
from planner.registry.examples import resolve_model
from planner.registry.references import Source, resolve_reference
from planner.synth.gguf_factory import llama_spec
from planner.system import net
from tests.support.fake_hub import (
    MODEL_MEDIA_TYPE,
    PROJECTOR_MEDIA_TYPE,
    Hosts,
    OllamaLayer,
    dead_endpoint,
    hosted,
    settle,
    write_hub_cache,
    write_ollama_store,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hosts(net_sandbox, http_servers, tmp_path, monkeypatch) -> Iterator[Hosts]:
    with hosted(http_servers, tmp_path, monkeypatch) as h:
        yield h


def gguf(hosts: Hosts, name: str, **kw) -> Path:
    return llama_spec(**kw).write(hosts.files / name)[0]


def repo_files(hosts: Hosts) -> dict[str, Path]:
    return {"README.md": hosts.files.joinpath("README.md"),
            "model-Q8_0.gguf": gguf(hosts, "a-Q8_0.gguf"),
            "model-Q4_K_M.gguf": gguf(hosts, "a-Q4_K_M.gguf"),
            "mmproj-model-f16.gguf": gguf(hosts, "mmproj-a-f16.gguf")}


# --- precedence ------------------------------------------------------------------------------------

def test_an_existing_path_wins_over_every_scheme(tmp_path, net_sandbox):
    path = tmp_path / "hf:odd.gguf"
    path.write_bytes(b"x")
    assert resolve_model(str(path)) == str(path)
    assert resolve_reference(str(path)).source is Source.LOCAL


def test_a_missing_path_stays_a_path_for_the_reader_to_refuse(net_sandbox):
    for spec in ("models/llama-3-8b.gguf", "./org/repo", "nothing-here.gguf"):
        assert resolve_model(spec) == spec


def test_an_unknown_scheme_is_one_line(net_sandbox):
    with pytest.raises(BadInput) as e:
        resolve_model("s3://bucket/model.gguf")
    assert "unknown scheme 's3'" in str(e.value) and "\n" not in str(e.value)


def test_urls_are_read_as_given_and_hub_page_urls_as_their_file_url(hosts):
    assert resolve_model("https://example.org/m.gguf") == "https://example.org/m.gguf"
    page = f"{hosts.hf.endpoint}/org/repo/blob/main/sub/m-Q4_K_M.gguf"
    assert resolve_model(page) == f"{hosts.hf.endpoint}/org/repo/resolve/main/sub/m-Q4_K_M.gguf"


@pytest.mark.parametrize("spec, repo, tag, file, revision", [
    ("hf://org/repo", "org/repo", "", "", None),
    ("hf://org/repo:Q4_K_M", "org/repo", "Q4_K_M", "", None),
    ("hf://org/repo:q8_0@v1.0", "org/repo", "q8_0", "", "v1.0"),
    ("hf://org/repo@v1.0:q8_0", "org/repo", "q8_0", "", "v1.0"),
    ("hf://org/repo@refs%2Fpr%2F3", "org/repo", "", "", "refs/pr/3"),
    ("hf://org/repo/sub/m.gguf", "org/repo", "", "sub/m.gguf", None),
    ("hf://org/repo@abc/m.gguf", "org/repo", "", "m.gguf", "abc"),
    ("hf.co/org/repo:Q4_K_M", "org/repo", "Q4_K_M", "", None),
    ("org/repo:Q4_K_M", "org/repo", "Q4_K_M", "", None),
])
def test_repository_references_parse(spec, repo, tag, file, revision):
    prefix = next((p for p in references.HF_PREFIXES if spec.startswith(p)), "")
    ref = references.parse_repo("hf", spec.removeprefix(prefix), spec)
    assert (ref.repo, ref.tag, ref.file, ref.revision) == (repo, tag, file, revision)


@pytest.mark.parametrize("spec, problem", [
    ("hf://org", "expected ORG/REPO"),
    ("hf://org/re..po", "not a repository id"),
    ("hf://org/repo/README.md", "not a .gguf file"),
])
def test_malformed_repository_references_are_one_line(net_sandbox, spec, problem):
    with pytest.raises(BadInput, match=problem) as e:
        resolve_model(spec)
    assert "\n" not in str(e.value)


# --- Hugging Face ----------------------------------------------------------------------------------

def test_a_quant_tag_resolves_to_its_file_url_at_the_repository_commit(hosts):
    hosts.files.joinpath("README.md").write_text("hi")
    hosts.hf.add("org/repo", repo_files(hosts), commit=COMMIT)
    ref = resolve_reference("hf://org/repo:Q4_K_M")
    assert ref.source is Source.HF
    assert ref.location == f"{hosts.hf.endpoint}/org/repo/resolve/{COMMIT}/model-Q4_K_M.gguf"
    assert ref.mmproj == f"{hosts.hf.endpoint}/org/repo/resolve/{COMMIT}/mmproj-model-f16.gguf"
    # one API request: the commit and the file list together
    assert [r.path for r in settle(hosts.hf.server).records()] == ["/api/models/org/repo"]
    # resolved once per process: asking again makes no request
    resolve_reference("hf://org/repo:Q4_K_M")
    assert settle(hosts.hf.server).requests() == 1


def test_no_tag_takes_llama_cpps_default_and_a_revision_its_commit(hosts):
    hosts.files.joinpath("README.md").write_text("hi")
    hosts.hf.add("org/repo", repo_files(hosts), commit=COMMIT, branches={"v2": "f" * 40})
    assert resolve_model("org/repo").endswith(f"/resolve/{COMMIT}/model-Q4_K_M.gguf")
    assert resolve_model("hf://org/repo:q8_0@v2").endswith(f"/resolve/{'f' * 40}/model-Q8_0.gguf")
    assert [r.path for r in settle(hosts.hf.server).records()][-1] == "/api/models/org/repo/revision/v2"


def test_a_three_shard_split_lists_every_shard(hosts):
    shards = llama_spec(n_layer=3).write(hosts.files / "big-Q4_K_M.gguf", shards=3)
    files = {f"Q4_K_M/{p.name}": p for p in shards}
    hosts.hf.add("org/big", files, commit=COMMIT)
    ref = resolve_reference("hf://org/big:Q4_K_M")
    base = f"{hosts.hf.endpoint}/org/big/resolve/{COMMIT}/Q4_K_M/big-Q4_K_M"
    assert ref.shards == tuple(f"{base}-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert ref.location == ref.shards[0]


def test_a_split_with_a_shard_missing_is_refused(hosts):
    shards = llama_spec(n_layer=3).write(hosts.files / "big-Q4_K_M.gguf", shards=3)
    hosts.hf.add("org/big", {p.name: p for p in shards[:2]})
    with pytest.raises(BadInput, match="shard 1 of 3 but org/big@cccccccccccc holds 2 of them"):
        resolve_model("hf://org/big:Q4_K_M")


def test_an_unknown_repository_is_one_line(hosts):
    with pytest.raises(BadInput) as e:
        resolve_model("hf://org/missing:Q4_K_M")
    assert str(e.value).startswith("hf://org/missing:Q4_K_M: no repository org/missing on ")
    assert "HF_TOKEN" in str(e.value) and "\n" not in str(e.value)


def test_no_file_for_the_tag_lists_the_quants_there_are(hosts):
    hosts.files.joinpath("README.md").write_text("hi")
    hosts.hf.add("org/repo", repo_files(hosts))
    with pytest.raises(BadInput) as e:
        resolve_model("hf://org/repo:Q2_K")
    assert str(e.value) == ("hf://org/repo:Q2_K: no quant tag 'Q2_K' in org/repo@cccccccccccc; "
                            "quants available: Q8_0, Q4_K_M")


def test_an_unknown_revision_is_one_line(hosts):
    hosts.hf.add("org/repo", {"m-Q4_K_M.gguf": gguf(hosts, "m-Q4_K_M.gguf")})
    with pytest.raises(BadInput, match="org/repo has no revision 'nope'"):
        resolve_model("hf://org/repo@nope")


def test_a_gated_repository_without_a_token_says_how_to_give_one(hosts):
    hosts.hf.add("org/gated", {"m-Q4_K_M.gguf": gguf(hosts, "m-Q4_K_M.gguf")}, gated=True)
    with pytest.raises(BadInput) as e:
        resolve_model("hf://org/gated")
    assert "org/gated is a gated repository" in str(e.value)
    assert "HF_TOKEN" in str(e.value) and "--token-file" in str(e.value)
    with net.use(net.overridden(token="hf_" + "x" * 34)):
        assert resolve_model("hf://org/gated").endswith("/m-Q4_K_M.gguf")


def test_a_dead_endpoint_is_one_line(net_sandbox):
    dead = dead_endpoint()
    with net.use(net.overridden(hf_endpoint=dead, ms_endpoint=dead, ollama_registry=dead, retries=0)):
        for spec, name in (("hf://org/repo", "Hugging Face"), ("ms://org/repo", "ModelScope"),
                           ("ollama://qwen3:8b", "Ollama registry")):
            with pytest.raises(BadInput) as e:
                resolve_model(spec)
            assert f"{name}" in str(e.value) and dead in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_preset_repository_is_not_a_model(hosts):
    preset = hosts.files / "preset.ini"
    preset.write_text("[model]\n")
    hosts.hf.add("org/preset", {"preset.ini": preset, "m-Q4_K_M.gguf": gguf(hosts, "m-Q4_K_M.gguf")})
    with pytest.raises(BadInput, match="preset repository"):
        resolve_model("hf://org/preset")


# --- local caches ----------------------------------------------------------------------------------

def test_a_hub_cache_hit_makes_no_request(hosts):
    hosts.hf.add("org/repo", {"m-Q4_K_M.gguf": gguf(hosts, "served-Q4_K_M.gguf")})
    snapshot = write_hub_cache(hosts.settings.hf_hub_cache, "org/repo",
                               {"m-Q8_0.gguf": gguf(hosts, "c-Q8_0.gguf"), "m-Q4_K_M.gguf": gguf(hosts, "c-Q4.gguf"),
                                "mmproj-F16.gguf": gguf(hosts, "c-mm.gguf")}, commit=COMMIT)
    ref = resolve_reference("hf://org/repo")
    assert ref.source is Source.HF_CACHE
    assert ref.location == str(snapshot / "m-Q4_K_M.gguf") and ref.mmproj == str(snapshot / "mmproj-F16.gguf")
    assert resolve_model("org/repo:Q8_0") == str(snapshot / "m-Q8_0.gguf")
    assert settle(hosts.hf.server).requests() == 0
    # a tag the cache lacks goes to the network
    hosts.hf.add("org/repo", {"m-Q2_K.gguf": gguf(hosts, "served-Q2_K.gguf")})
    assert resolve_reference("hf://org/repo:Q2_K").source is Source.HF


def test_a_llama_cache_hit_makes_no_request_and_a_split_needs_every_shard(hosts):
    shards = llama_spec(n_layer=3).write(hosts.files / "s-Q4_K_M.gguf", shards=3)
    snapshot = write_hub_cache(hosts.settings.llama_cache, "org/split", {p.name: p for p in shards}, commit=COMMIT)
    ref = resolve_reference("hf://org/split:Q4_K_M")
    assert ref.source is Source.HF_CACHE
    assert ref.shards == tuple(str(snapshot / f"s-Q4_K_M-0000{i}-of-00003.gguf") for i in (1, 2, 3))
    assert settle(hosts.hf.server).requests() == 0
    # a shard whose blob is gone (a download cut short) sends the reference to the network
    part = llama_spec(n_layer=3).write(hosts.files / "p-Q8_0.gguf", shards=3)
    snap2 = write_hub_cache(hosts.settings.llama_cache, "org/part", {p.name: p for p in part}, commit=COMMIT)
    (snap2 / "p-Q8_0-00003-of-00003.gguf").resolve().unlink()
    with pytest.raises(BadInput, match="no repository org/part"):
        resolve_model("hf://org/part:Q8_0")
    assert settle(hosts.hf.server).requests() == 1


def test_a_cached_revision_is_found_by_its_ref_or_its_commit(hosts):
    snapshot = write_hub_cache(hosts.settings.hf_hub_cache, "org/repo", {"m-Q4_K_M.gguf": gguf(hosts, "r.gguf")},
                               commit=COMMIT, branch="v1")
    assert resolve_model("hf://org/repo@v1") == str(snapshot / "m-Q4_K_M.gguf")
    assert resolve_model(f"hf://org/repo@{COMMIT}") == str(snapshot / "m-Q4_K_M.gguf")
    # no refs/main: llama.cpp takes the first valid ref (hf-cache.cpp:353-381)
    assert resolve_model("hf://org/repo") == str(snapshot / "m-Q4_K_M.gguf")
    assert settle(hosts.hf.server).requests() == 0


# --- ModelScope ------------------------------------------------------------------------------------

def test_a_modelscope_reference_resolves_the_same_way(hosts):
    hosts.ms.add("org/repo", {"Q4_K_M/m-Q4_K_M.gguf": gguf(hosts, "m1.gguf"),
                              "Q8_0/m-Q8_0.gguf": gguf(hosts, "m2.gguf")})
    resolved = resolve_model("ms://org/repo:q4_k_m")
    assert resolved == f"{hosts.ms.endpoint}/models/org/repo/resolve/master/Q4_K_M/m-Q4_K_M.gguf"
    assert resolve_model("modelscope.cn/org/repo").endswith("/Q4_K_M/m-Q4_K_M.gguf")
    with pytest.raises(BadInput, match="quants available: Q4_K_M, Q8_0"):
        resolve_model("ms://org/repo:IQ1_S")
    with pytest.raises(BadInput, match="ms://org/none: no repository org/none"):
        resolve_model("ms://org/none")


# --- Ollama ----------------------------------------------------------------------------------------

def test_an_ollama_name_reads_the_local_store(hosts):
    model, proj = gguf(hosts, "qwen.gguf"), hosts.files / "proj.bin"
    proj.write_bytes(b"GGUF projector")
    layers = [OllamaLayer(MODEL_MEDIA_TYPE, model), OllamaLayer(PROJECTOR_MEDIA_TYPE, proj)]
    write_ollama_store(hosts.settings.ollama_models, "qwen3", "30b-a3b", layers)
    blob = hosts.settings.ollama_models / "blobs" / layers[0].digest.replace(":", "-")
    for spec in ("ollama://qwen3:30b-a3b", "ollama://library/qwen3:30b-a3b", "qwen3:30b-a3b"):
        ref = resolve_reference(spec)
        assert ref.location == str(blob) and ref.source is Source.OLLAMA_STORE, spec
        assert ref.mmproj == str(hosts.settings.ollama_models / "blobs" / layers[1].digest.replace(":", "-"))
        assert ref.warnings == ()
    assert settle(hosts.ollama.server).requests() == 0


def test_an_ollama_namespace_and_the_latest_tag(hosts):
    layers = [OllamaLayer(MODEL_MEDIA_TYPE, gguf(hosts, "m.gguf"))]
    write_ollama_store(hosts.settings.ollama_models, "mymodel", "latest", layers, namespace="someone")
    assert resolve_model("ollama://someone/mymodel").endswith(layers[0].digest.replace(":", "-"))


def test_an_ollama_name_not_pulled_comes_from_the_registry(hosts):
    layers = [OllamaLayer(MODEL_MEDIA_TYPE, gguf(hosts, "m.gguf"))]
    hosts.ollama.add("qwen3", "8b", layers)
    ref = resolve_reference("ollama://qwen3:8b")
    assert ref.source is Source.OLLAMA_REGISTRY
    assert ref.location == f"{hosts.ollama.endpoint}/v2/library/qwen3/blobs/{layers[0].digest}"
    manifest = settle(hosts.ollama.server).records("/v2/library/qwen3/manifests/8b")[0]
    assert "manifest.v2+json" in manifest.headers["accept"]


def test_an_unknown_ollama_model_is_one_line(hosts):
    with pytest.raises(BadInput) as e:
        resolve_model("ollama://nosuch:7b")
    assert str(e.value).startswith("ollama://library/nosuch:7b: no such Ollama model")
    assert "\n" not in str(e.value)


def test_an_ollama_blob_llama_cpp_cannot_load_is_flagged(hosts, caplog):
    # Ollama's llama3.2-vision is architecture "mllama", with its vision tower in the same file
    spec = llama_spec(arch="mllama")
    spec.tensors.append(("v.blk.0.attn_q.weight", spec.tensors[0][1], (256, 256)))
    layers = [OllamaLayer(MODEL_MEDIA_TYPE, spec.write(hosts.files / "mllama.gguf")[0])]
    write_ollama_store(hosts.settings.ollama_models, "llama3.2-vision", "11b", layers)
    with caplog.at_level("WARNING"):
        ref = resolve_reference("ollama://llama3.2-vision:11b")
    assert len(ref.warnings) == 2
    assert "architecture 'mllama' is not one the pinned llama.cpp knows" in ref.warnings[0]
    assert "1 vision tensors (e.g. v.blk.0.attn_q.weight)" in ref.warnings[1]
    assert "wrong number of tensors" in ref.warnings[1]
    assert ref.warnings[0] in caplog.text


def test_an_ollama_blob_that_is_not_gguf_is_refused(hosts):
    blob = hosts.files / "notgguf"
    blob.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    write_ollama_store(hosts.settings.ollama_models, "odd", "latest", [OllamaLayer(MODEL_MEDIA_TYPE, blob)])
    with pytest.raises(BadInput, match="is not a GGUF the pinned llama.cpp can load") as e:
        resolve_model("ollama://odd")
    assert "\n" not in str(e.value)


def test_an_ollama_model_of_tensor_layers_has_nothing_to_plan_from(hosts):
    blob = hosts.files / "t"
    blob.write_bytes(b"\0" * 8)
    layer = OllamaLayer("application/vnd.ollama.image.tensor; name=tok_embeddings; dtype=BF16; shape=8", blob)
    write_ollama_store(hosts.settings.ollama_models, "st", "latest", [layer])
    hosts.ollama.add("st", "latest", [layer])
    with pytest.raises(BadInput, match="per-tensor layers for Ollama's own engine"):
        resolve_model("ollama://st")


def test_a_named_file_resolves_exactly_or_lists_the_gguf_files(hosts):
    hosts.hf.add("org/repo", {"sub/m-Q4_K_M.gguf": gguf(hosts, "f1.gguf"), "m-Q8_0.gguf": gguf(hosts, "f2.gguf")},
                 commit=COMMIT)
    assert resolve_model("huggingface.co/org/repo/sub/m-Q4_K_M.gguf") == \
        f"{hosts.hf.endpoint}/org/repo/resolve/{COMMIT}/sub/m-Q4_K_M.gguf"
    with pytest.raises(BadInput) as e:
        resolve_model("hf://org/repo/m-Q4_K_M.gguf")
    assert str(e.value) == ("hf://org/repo/m-Q4_K_M.gguf: no file 'm-Q4_K_M.gguf' in org/repo@0123456789ab; "
                            "its GGUF files: sub/m-Q4_K_M.gguf, m-Q8_0.gguf")


def test_an_ollama_pull_from_another_host_is_found_under_that_host(hosts):
    # `ollama pull hf.co/ORG/REPO:Q4_K_M` keeps its manifest under manifests/hf.co/ORG/REPO/Q4_K_M
    layers = [OllamaLayer(MODEL_MEDIA_TYPE, gguf(hosts, "h.gguf"))]
    write_ollama_store(hosts.settings.ollama_models, "Model-GGUF", "Q4_K_M", layers, namespace="org", host="hf.co")
    ref = resolve_reference("ollama://hf.co/org/Model-GGUF:Q4_K_M")
    assert ref.source is Source.OLLAMA_STORE and ref.location.endswith(layers[0].digest.replace(":", "-"))
