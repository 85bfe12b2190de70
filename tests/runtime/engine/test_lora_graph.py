"""Applied LoRA adapters in the runtime's graphs (runtime/engine/lora.py).

llama.cpp (src/llama-graph.cpp build_lora_mm, build_inp_embd) adds four nodes per applied pair:
mul_mat(A, x), mul_mat(B, .), scale, add (get_rows(A, tokens) in place of the first for
token_embd); llama-server's "graph: nodes" line of its warmup reserve shows it
(tests/peer/test_lora_peer.py checks that live). Scale 0 and --lora-init-without-apply leave the
graph as it is (llama-context.cpp set_adapters_lora, common_init_from_params). The pairs' tensors
live in the patched weight's buffer, a repacked weight's on the CPU (llama-adapter.cpp). Decoding
with an adapter equals decoding the merged weights, merged here from the definition.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from planner.gguf.reader import TensorInfo, read_model
from planner.llama.flags import parse_llama_flags
from planner.synth.lora_factory import lora_layout, write_lora
from planner.synth.tiny_models import Dims, tensor_layout, write_tiny
from runtime.engine.runner import ModelRunner

PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
RPC2 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002"]


def _bases(arch: str, names: list[str]) -> list[tuple[str, tuple[int, ...]]]:
    shapes = {name: shape for name, shape, _q in tensor_layout(arch, Dims())}
    return [(n, shapes[n]) for n in names]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora-graph")
    out = {}
    for arch in ("llama", "qwen2", "gemma3"):
        names = [f"blk.{i}.{p}.weight" for i in range(Dims().n_layer) for p in PROJ]
        if arch != "gemma3":   # gemma3 ties its output to token_embd: llama.cpp aborts on that pair
            names += ["token_embd.weight", "output.weight"]
        out[arch] = write_tiny(d / f"{arch}.gguf", arch)
        out[f"{arch}-all"] = write_lora(d / f"{arch}-all.gguf", arch, lora_layout(_bases(arch, names), 4, Q.F16))
        out[f"{arch}-v"] = write_lora(d / f"{arch}-v.gguf", arch,
                                      lora_layout(_bases(arch, ["blk.0.attn_v.weight"]), 2, Q.F32), seed=1)
    return out


def _report(model: Path, argv: list[str]) -> tuple[ModelRunner, int, int]:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256", *argv]), weights=False)
    report = runner.reserve_report
    assert report is not None
    return runner, report.n_nodes_pp, report.n_nodes_tg


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_four_nodes_per_applied_pair(arch: str, files: dict[str, Path]) -> None:
    _r, pp, tg = _report(files[arch], [])
    n_all = Dims().n_layer * len(PROJ) + (0 if arch == "gemma3" else 2)
    runner, pp_lora, tg_lora = _report(files[arch], ["--lora", str(files[f"{arch}-all"]),
                                                     "--lora-scaled", f"{files[f'{arch}-v']}:0.5"])
    assert pp_lora - pp == 4 * (n_all + 1)
    assert tg_lora - tg == 4 * (n_all + 1)
    assert runner.adapters.unreached() == []


def test_unapplied_adapters_leave_the_graph(files: dict[str, Path]) -> None:
    base = _report(files["llama"], [])
    compute = base[0].compute_bytes()
    for argv in (["--lora-scaled", f"{files['llama-all']}:0"], ["--lora", str(files["llama-all"]),
                                                               "--lora-init-without-apply"]):
        runner, pp, tg = _report(files["llama"], argv)
        assert (pp, tg) == base[1:]
        assert runner.compute_bytes() == compute
        assert runner.lora_bytes == {}


def test_pairs_live_with_the_patched_weight(files: dict[str, Path]) -> None:
    """-ngl 99 over two devices, layer 0 on RPC0 and layer 1 on RPC1, the output matrix on RPC1 and
    token_embd on the host; the compute of the devices that run adapter matmuls grows."""
    argv = [*RPC2, "-ngl", "99", "-ts", "1,1"]
    base, _pp, _tg = _report(files["llama"], argv)
    runner, _pp, _tg = _report(files["llama"], [*argv, "--lora", str(files["llama-all"])])
    where = {lw.a.name: lw.a.buffer.buft.device.name for lws in runner.adapters.by_base.values() for lw in lws}
    assert where["blk.0.attn_q.weight.lora_a"] == runner.weights["blk.0.attn_q.weight"].buffer.buft.device.name
    assert where["blk.1.ffn_down.weight.lora_a"] == runner.weights["blk.1.ffn_down.weight"].buffer.buft.device.name
    assert where["token_embd.weight.lora_a"] == "CPU"
    assert set(runner.lora_bytes) == {"RPC0", "RPC1", "CPU"}
    before, after = base.compute_bytes(), runner.compute_bytes()
    assert after["RPC0"] > before["RPC0"] and after["RPC1"] > before["RPC1"]


def test_decode_with_an_adapter_equals_the_merged_weights(tmp_path: Path) -> None:
    """Running the adapter's matmuls equals running W + scale * B A (token_embd: E + scale * A B^T),
    the merge written here from the definition into a copy of the file, scale = s * alpha / rank."""
    model = write_tiny(tmp_path / "f32.gguf", "llama", all_f32=True)
    bases = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight", "output.weight"]
    rank, alpha, s = 4, 8.0, 30.0
    lora = write_lora(tmp_path / "a.gguf", "llama", lora_layout(_bases("llama", bases), rank, Q.F32), alpha=alpha)
    merged = tmp_path / "merged.gguf"
    shutil.copyfile(model, merged)
    data, ad = np.memmap(merged, dtype=np.uint8, mode="r+"), read_model(str(lora))
    adata = np.memmap(lora, dtype=np.uint8, mode="r")
    infos = {t.name: t for t in read_model(str(merged)).tensors}

    def arr(buf: np.ndarray, info: TensorInfo) -> np.ndarray:
        return buf[info.data_offset:info.data_offset + info.n_bytes].view(np.float32).reshape(info.shape[::-1])

    for name in bases:
        a, b = (arr(adata, ad.tensor(name + suffix)) for suffix in (".lora_a", ".lora_b"))
        w = arr(data, infos[name])
        w += (alpha / rank * s) * (a @ b.T if name == "token_embd.weight" else b @ a)
    data.flush()
    tokens = [1, 5, 9, 200, 3, 7]
    with_lora = ModelRunner.load(str(model), parse_llama_flags(["-c", "256", "--lora-scaled", f"{lora}:{s}"]))
    plain = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"])).decode(tokens)
    got, ref = with_lora.decode(tokens), ModelRunner.load(str(merged), parse_llama_flags(["-c", "256"])).decode(tokens)
    assert np.abs(ref - plain).max() > 100 * np.abs(got - ref).max()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
