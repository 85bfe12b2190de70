"""The runner under `-sm tensor` (issue #20, deliverable 3): the placement's one Meta() device becomes a
meta backend over its members, weights and KV caches live in its buffer, flash attention is on, the
scheduler sees [Meta(), CPU] — and the logits equal the runner's own on one device.

The bound is the issue's: the same top-1 token at every position and max |delta| <= 1e-3 x the
logits' max magnitude (the members' partial sums change the float order, nothing else). The reduce
counts and bytes are llama.cpp's by hand (ggml-backend-meta.cpp, see planner/checking/allreduce_report.py):
two reduces per layer of the [n_embd, n_tokens] f32 residual, N=2: 2 B pushed, N=3: B (fold) + 2 B
(butterfly) + B (copy back), N=4: 2 x 4 B.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.checking.validate import validate
from planner.checking.validation_report import ValidateRequest
from planner.llama.flags import parse_llama_flags
from planner.synth.tiny_models import Dims, write_tiny
from runtime.engine.meta_runner import TimedMetaBackend
from runtime.engine.runner import ModelRunner
from runtime.ggml.meta_device import MetaDevice

PROMPT = [1, 5, 9, 33, 7, 100, 42, 200, 3, 17, 64, 128]
# default: n_ff 256 is two 128-element FFN slices; odd-heads: 6 query heads in 3 KV groups that 2 and
# 4 members cannot share evenly
DIMS = {"default": Dims(n_ff=256), "odd-heads": Dims(n_embd=64, n_head=6, n_head_kv=3, head_dim=16, n_ff=384)}
BYTES_PER_REDUCE_IN_TENSORS = {2: 2, 3: 4, 4: 8}


def _endpoints(n: int) -> str:
    return ",".join(f"127.0.0.1:{50100 + j}" for j in range(n))   # never contacted: the runtime's devices


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("meta-runner")
    return {name: write_tiny(d / f"llama-{name}.gguf", "llama", dims) for name, dims in DIMS.items()}


def _runner(path: Path, n: int) -> ModelRunner:
    flags = ["-c", "256", "--rpc", _endpoints(n), "-ngl", "99"] + (["-sm", "tensor"] if n > 1 else [])
    return ModelRunner.load(str(path), parse_llama_flags(flags))


def _close(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.array_equal(got.argmax(-1), ref.argmax(-1))
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert rel <= 1e-3
    return rel


@pytest.mark.parametrize("dims", list(DIMS))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_tensor_split_logits_equal_the_single_device_logits(models: dict[str, Path], dims: str, n: int) -> None:
    single, split = _runner(models[dims], 1), _runner(models[dims], n)
    # the scheduler sees two backends, as llama.cpp's: the meta device (named as llama.cpp prints it) and the CPU
    assert [b.name for b in split.sched.backends] == ["Meta()", "CPU"]
    meta = split.backends["Meta()"]
    assert isinstance(meta, TimedMetaBackend) and isinstance(meta.device, MetaDevice)
    assert [m.name for m in meta.device.members] == [f"RPC{j}" for j in range(n)]
    assert split.cp.flash_attn
    # weights past the input layer and every KV cache are in the meta buffer
    assert set(split.kv_bytes) == {"Meta()"}
    assert split.weights["blk.0.attn_q.weight"].buffer is not None
    assert split.weights["blk.0.attn_q.weight"].buffer.buft is meta.buffer_type
    _close(split.decode(PROMPT), single.decode(PROMPT))
    # then token by token over the cache the prompt filled (the one-token graph)
    for tok in (11, 250, 4):
        _close(split.decode([tok]), single.decode([tok]))
        reduces = split.steps[-1].reduces
        assert reduces is not None
        n_layer, n_embd = split.hp.n_layer, split.hp.n_embd
        assert reduces.n_reduces == 2 * n_layer
        assert reduces.bytes_moved == 2 * n_layer * BYTES_PER_REDUCE_IN_TENSORS[n] * n_embd * 4


def test_prompt_reduces_move_the_whole_batch(models: dict[str, Path]) -> None:
    split = _runner(models["default"], 2)
    split.decode(PROMPT)
    reduces = split.steps[-1].reduces
    assert reduces is not None
    assert reduces.bytes_moved == 2 * split.hp.n_layer * 2 * split.hp.n_embd * len(PROMPT) * 4


def test_validate_reports_the_allreduce_beside_llama_cpp(models: dict[str, Path]) -> None:
    flags = parse_llama_flags(["-sm", "tensor", "--rpc", _endpoints(3), "-ngl", "99", "-c", "256"])
    report = validate(ValidateRequest(str(models["default"]), flags, n_prompt=8, n_gen=2))
    ar = report.allreduce
    assert ar is not None
    # 2 layers x 2 reduces of one 64-float token row (256 B), 4 tensors' worth each over 3 members
    assert (ar.n_devices, ar.reduces_per_layer, ar.bytes_per_token) == (3, 2, 2 * 2 * 4 * 256)
    assert (ar.llama_cpp_reduces_per_layer, ar.llama_cpp_bytes_per_token) == (2, 4096)
    assert "2 reduces per layer, 4096 B moved (llama.cpp: 2 per layer, 4096 B)" in report.to_table()
    # with -ngl 2 the output layer and the last of the 2 repeating layers are on the meta device: one reduced
    flags = parse_llama_flags(["-sm", "tensor", "--rpc", _endpoints(2), "-ngl", "2", "-c", "256"])
    ar = validate(ValidateRequest(str(models["default"]), flags, n_prompt=8, n_gen=2)).allreduce
    assert ar is not None and (ar.n_layer, ar.reduces_per_token, ar.llama_cpp_reduces_per_token) == (1, 2, 2)
    assert ar.bytes_per_token == ar.llama_cpp_bytes_per_token == 2 * 2 * 256
    assert report.to_dict()["allreduce"]["llama_cpp"]["bytes_per_token"] == 4096
