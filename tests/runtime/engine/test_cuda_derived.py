"""CUDA compute buffers derived by hand from the pinned llama.cpp, checked against the estimate.

No GPU is needed and none is used: every expected figure below is worked out in the test from
ggml's rules (llama.cpp in llama-cpp-python 0.3.36), never from the runtime, and compared with
`planner.memory.estimate.estimate` to within 1 MiB. The rules, by source:

- ggml-backend.cpp ggml_backend_sched_backend_id_from_cur ("1.off"): an op whose weight sits in
  a host buffer runs on the FIRST backend that supports it and whose offload_op says yes;
  ggml-cuda.cu ggml_backend_cuda_device_offload_op: get_op_batch_size(op) >= op_offload_min_batch
  (GGML_OP_OFFLOAD_MIN_BATCH read with atoi in ggml_backend_cuda_reg, default 32), the batch being
  MUL_MAT ne[1], MUL_MAT_ID / ROPE ne[2], GET_ROWS 0, anything else nrows.
- ggml-backend.cpp ggml_backend_sched_split_graph pass 5: a source on an incompatible buffer is
  copied into the split's backend ("staged" when it is a weight); a node with a foreign weight
  starts a new split. With one copy (no pipeline parallelism) copies are ordinary tensors, freed
  after their last consumer; the input_dep/input_cpy nodes allocate them at the split's start, in
  the order of the node's sources.
- ggml-cuda.cu ggml_backend_cuda_buffer_type_get_alloc_size: a quantized tensor whose ne0 is not
  a multiple of MATRIX_ROW_PADDING (512) takes row_size(type, 512 - ne0 % 512) more; alignment 128
  (ggml_backend_cuda_buffer_type_get_alignment). The CPU backend's compute buffer in a CUDA build
  is CUDA_Host, aligned as the CPU's (TENSOR_ALIGNMENT 32), no padding.
- ggml-alloc.c: leafs and INPUT-flagged tensors are allocated before any node; the dynamic
  allocator takes the best-fitting free block other than the tail, else the tail, so the arena
  never grows by more than the allocation's size; a tensor is freed after its last consumer.
- llama-context.cpp sched_reserve / graph_reserve: the prompt graph has n_tokens = min(n_ctx,
  n_ubatch) tokens and as many outputs. In llama-fit-params' dry run (no_alloc) only that first
  prompt reserve sizes the buffers (graph_reserve passes `sizes` to ggml_backend_sched_reserve_size
  once); the one-token graph and the second prompt graph are only split, so a one-token graph that
  runs its output on the CPU while the prompt's is offloaded adds nothing to the Host row.
- llama-graph.cpp build_inp_embd (inp_tokens I32 [T], inp_embd F32 [n_embd, T], a leaf never
  consumed nor freed), build_inp_pos (I32 [T]), build_inp_out_ids (I32 [T]),
  build_attn_inp_kq_mask (F16 [n_kv, T] with flash attention), llama-kv-cache.cpp
  build_input_k_idxs / build_input_v_idxs (I64 [T]); the reserve's n_kv is the whole cache.

Where a derivation cannot be exact (the activations of the layers a device runs), the model is
made so that those terms are small, and the test states the bound: the derived terms are live
together (a lower bound), and the arena is at most the derived terms plus the sum of every other
allocation in that buffer (an upper bound, from the allocator rule above), which the test works
out and shows to be under 1 MiB.

The constants are restated here on purpose, with their sources: this file is the independent
derivation the runtime is checked against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from planner.api import as_inventory
from planner.core.units import GiB
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.search.result import PlanRequest, llama_argv
from planner.search.search import plan
from planner.synth.gguf_factory import llama_spec, qwen3moe_spec
from tests.support.overhead import CUDA_MIB, cuda

Q = GGMLQuantizationType
MiB = 1 << 20
TOL = MiB                   # the brief: exact to within 1 MiB
CUDA_ALIGN = 128            # ggml-cuda.cu ggml_backend_cuda_buffer_type_get_alignment
HOST_ALIGN = 32             # ggml-impl.h TENSOR_ALIGNMENT (CUDA_Host uses the CPU buffer type's)
MATRIX_ROW_PADDING = 512    # ggml-cuda/common.cuh
NOT_QUANTIZED = {Q.F32, Q.F16, Q.BF16}

# --- the models ---------------------------------------------------------------------------------
# "wide": two tiny llama layers (n_embd 64, head_dim 32, one KV head, n_ff 128, all Q8_0) under a
# 131072-token vocabulary, so the output phase (a 8.5 MiB output matrix, 0.5 MiB of logits per
# token) dwarfs everything a layer allocates.
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB, N_LAYER = 64, 2, 1, 128, 131072, 2
HEAD_DIM = N_EMBD // N_HEAD
N_CTX = 256                 # a multiple of 256: the KV cache (and the reserve's n_kv) is exactly this
# "tied": the same layers with no output.weight (llama.cpp uses token_embd, TENSOR_DUPLICATED), F16
# embeddings so the staged matrix takes no CUDA row padding (F16 is not quantized).
# "moe": one qwen3moe layer whose routed experts are the big tensors.
MOE = dict(n_layer=1, n_embd=256, n_head=4, n_head_kv=1, head_dim=64, n_expert=128, n_expert_used=2,
           n_ff_exp=128, n_vocab=512)


def _wide(**kw):
    return llama_spec(n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV, n_ff=N_FF,
                      n_vocab=N_VOCAB, attn_type=Q.Q8_0, v_type=Q.Q8_0, ffn_type=Q.Q8_0, down_type=Q.Q8_0,
                      embd_type=kw.pop("embd_type", Q.Q8_0), out_type=kw.pop("out_type", Q.Q8_0))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda_derived")
    [wide] = _wide().write(d / "wide.gguf")
    [tied] = _wide(embd_type=Q.F16, out_type=None).write(d / "tied.gguf")
    [moe] = qwen3moe_spec(**MOE).write(d / "moe.gguf")
    [moe2] = qwen3moe_spec(**{**MOE, "n_layer": 2}).write(d / "moe2.gguf")
    return {k: model_context(str(p)) for k, p in
            {"wide": wide, "tied": tied, "moe": moe, "moe2": moe2}.items()}


@pytest.fixture(autouse=True)
def _default_offload_batch(monkeypatch):
    monkeypatch.delenv("GGML_OP_OFFLOAD_MIN_BATCH", raising=False)


# --- the terms ----------------------------------------------------------------------------------

def pad(n: int, align: int) -> int:
    return -(-n // align) * align


def row_size(qtype: Q, n: int) -> int:
    """ggml_row_size: bytes of n elements of a type (whole blocks)."""
    block, size = GGML_QUANT_SIZES[qtype]
    assert n % block == 0
    return n // block * size


def nbytes(qtype: Q, shape: tuple[int, ...]) -> int:
    return row_size(qtype, shape[0]) * math.prod(shape[1:])


def cuda_alloc(qtype: Q, shape: tuple[int, ...]) -> int:
    """A tensor in a CUDA buffer: nbytes plus the quantized-row padding, aligned 128."""
    extra = 0
    if qtype not in NOT_QUANTIZED and shape[0] % MATRIX_ROW_PADDING:
        extra = row_size(qtype, MATRIX_ROW_PADDING - shape[0] % MATRIX_ROW_PADDING)
    return pad(nbytes(qtype, shape) + extra, CUDA_ALIGN)


def f32(*shape: int) -> int:
    return 4 * math.prod(shape)


# the output matrix (output.weight, Q8_0 [64, 131072]): 131072 rows of 2 blocks x 34 bytes, plus one
# padding row of 448 elements (14 blocks x 34 = 476 bytes), aligned 128
STAGED_OUTPUT = cuda_alloc(Q.Q8_0, (N_EMBD, N_VOCAB))
assert STAGED_OUTPUT == pad(131072 * 68 + 476, 128) == 8_913_408
# the tied model's output is token_embd, F16 [64, 131072]: no padding
STAGED_TIED = cuda_alloc(Q.F16, (N_EMBD, N_VOCAB))
assert STAGED_TIED == 64 * 2 * 131072


def logits(t: int) -> int:
    """result_output: F32 [n_vocab, n_outputs]; the reserve's outputs are its tokens."""
    return f32(N_VOCAB, t)


def hidden(t: int) -> int:
    """The f32 hidden state [n_embd, T] (result_norm, crossing into a device as a split input)."""
    return f32(N_EMBD, t)


def host_inputs(t: int, n_kv: int = N_CTX) -> int:
    """The graph inputs on the CPU, all allocated before any node (ggml-alloc.c): inp_tokens I32,
    inp_embd F32 [n_embd, T], inp_pos I32, k_idxs and v_idxs I64, the f16 KQ mask [n_kv, T],
    out_ids I32; each aligned 32."""
    sizes = [4 * t, hidden(t), 4 * t, 8 * t, 8 * t, 2 * n_kv * t, 4 * t]
    return sum(pad(s, HOST_ALIGN) for s in sizes)


def host_offloaded(t: int, n_kv: int = N_CTX) -> int:
    """Host compute when the prompt's output matmul is offloaded (every layer on a GPU): in the
    prompt graph only the embedding lookup runs on the CPU, so the inputs plus the GET_ROWS result
    [n_embd, T], allocated before anything is freed (GET_ROWS is the first node), and nothing after.
    A dry run sizes that prompt reserve alone (llama-context.cpp sched_reserve passes its size array
    to the first graph_reserve only; the one-token graph, whose batch-1 output matmul would stay on the
    CPU with 512 KiB of logits, is only split)."""
    return host_inputs(t, n_kv) + hidden(t)


def host_runs_output(t: int) -> int:
    """Host compute when the CPU runs the output matmul (batch under the offload threshold, or
    --no-op-offload) and every layer is on a GPU. When the output split starts only two CPU tensors
    lie below the tail: the freed inp_tokens hole at offset 0 (smaller than anything that follows)
    and the inp_embd leaf above it (never consumed, never freed); every other input was freed after
    its copy to the GPU and merged into the tail. The result_norm copy, then the logits, go on the
    tail. (The peak before, inputs plus the embedding rows, is smaller.)"""
    return pad(4 * t, HOST_ALIGN) + hidden(t) + hidden(t) + logits(t)


def layer_bound(t: int, n_kv: int = N_CTX) -> int:
    """Every byte one wide llama layer can allocate on a device at T tokens, summed (an upper bound
    on its share of the arena): the node outputs of src/models/llama.cpp + build_attn, the copies a
    split can take in, and all the layer's weights staged (the host-layer case).
      [n_embd, T] f32: attn rms_norm, its MUL, Qcur, q rope, FA output (head_dim x n_head = n_embd),
                       wo, residual ADD, ffn rms_norm, its MUL, ffn_down, residual ADD, plus two
                       crossing copies of the hidden state: 13
      [head_dim x n_head_kv, T] f32: Kcur, Vcur, k rope: 3
      [n_ff, T] f32: ffn_gate, ffn_up, swiglu: 3
      copies: the f16 KQ mask [n_kv, T], the f16 K and V cache views [head_dim, n_kv, n_head_kv],
              inp_pos, k_idxs, v_idxs, out_ids
      staged weights: wq, wk, wv, wo, gate, up, down (Q8_0 with CUDA padding), two f32 norms
      plus 128 bytes of alignment for each of at most 40 allocations."""
    acts = 13 * f32(N_EMBD, t) + 3 * f32(HEAD_DIM * N_HEAD_KV, t) + 3 * f32(N_FF, t)
    copies = 2 * n_kv * t + 2 * (2 * HEAD_DIM * n_kv * N_HEAD_KV) + 4 * t + 8 * t + 8 * t + 4 * t
    weights = (2 * cuda_alloc(Q.Q8_0, (N_EMBD, N_EMBD)) + 2 * cuda_alloc(Q.Q8_0, (N_EMBD, HEAD_DIM * N_HEAD_KV))
               + 2 * cuda_alloc(Q.Q8_0, (N_EMBD, N_FF)) + cuda_alloc(Q.Q8_0, (N_FF, N_EMBD)) + 2 * f32(N_EMBD))
    return acts + copies + weights + 40 * CUDA_ALIGN


def output_phase_bound(t: int) -> int:
    """The output phase's small allocations besides the derived terms: result_norm's RMS_NORM and
    MUL outputs ([n_embd, T] f32 each), a staged output_norm (f32 [n_embd]), alignment."""
    return 2 * hidden(t) + f32(N_EMBD) + 4 * CUDA_ALIGN


@dataclass(frozen=True)
class Derived:
    """A derived figure: `low` is what is provably live at once; the arena is at most low + slack."""

    low: int
    slack: int = 0

    def check(self, actual: int, what: str) -> None:
        assert self.slack < TOL, f"{what}: the bound on the underived terms ({self.slack}) is not under 1 MiB"
        assert abs(actual - self.low) <= TOL, f"{what}: estimate {actual} vs derived {self.low}"
        assert self.low <= actual <= self.low + self.slack, \
            f"{what}: estimate {actual} outside the derived [{self.low}, {self.low + self.slack}]"


def compute(e, name: str) -> int:
    d = e.device(name)
    assert d is not None, f"no {name} row in {[x.name for x in e.devices]}"
    return d.compute_bytes


def est(models, model: str, argv: str, devices: list[str]):
    return estimate(models[model], argv.split(), as_inventory(devices))


TWO = ["CUDA0=8GiB", "CUDA1=8GiB"]
THREE = ["CUDA0=8GiB", "CUDA1=8GiB", "CUDA2=8GiB"]
ONE = ["CUDA0=8GiB"]
OUT_CPU = r"-ot ^output\.weight=CPU"


def ctx_for(t: int) -> int:
    return max(N_CTX, t)


# --- 1. the output matrix on the host, CUDA0 holding nothing else (-ts 0,1) ------------------------
# With -ts 0,1 every layer and the output layer's norm live on CUDA1; CUDA0 is the first backend, so
# the offloaded output matmul (MUL_MAT, batch ne[1] = n_outputs = T) is its only work: one split
# whose inputs are the staged output matrix (src[0]) and the result_norm copy from CUDA1 (src[1]),
# then the logits. All three are live together and nothing else is ever allocated there: exact.


def output_on_cuda0(staged: int, t: int) -> Derived:
    return Derived(staged + hidden(t) + logits(t))


@pytest.mark.parametrize("ub", [32, 64, 128, 512])
def test_output_matrix_on_host_is_staged_on_cuda0(models, ub):
    c = ctx_for(ub)
    e = est(models, "wide", f"-c {c} -ub {ub} -ts 0,1 {OUT_CPU}", TWO)
    assert dict(e.layers) == {"CUDA1": (0, 1, 2)}
    output_on_cuda0(STAGED_OUTPUT, ub).check(compute(e, "CUDA0"), "CUDA0")
    Derived(host_offloaded(ub, c)).check(compute(e, "Host"), "Host")


@pytest.mark.parametrize("ub", [16, 31])
def test_below_32_tokens_nothing_is_offloaded(models, ub):
    # MUL_MAT batch ne[1] = T < 32: the output matmul stays with its weight on the CPU; CUDA0 runs
    # nothing at all and the Host row holds the logits.
    e = est(models, "wide", f"-c {N_CTX} -ub {ub} -ts 0,1 {OUT_CPU}", TWO)
    assert compute(e, "CUDA0") == 0
    Derived(host_runs_output(ub)).check(compute(e, "Host"), "Host")


@pytest.mark.parametrize("ub", [128, 512])
def test_no_op_offload_keeps_the_output_matmul_on_the_host(models, ub):
    # sched->op_offload false: the "1.off" branch is never taken, whatever the batch
    c = ctx_for(ub)
    e = est(models, "wide", f"-c {c} -ub {ub} -ts 0,1 {OUT_CPU} --no-op-offload", TWO)
    assert compute(e, "CUDA0") == 0
    Derived(host_runs_output(ub)).check(compute(e, "Host"), "Host")


def test_three_gpus_layers_on_two_the_first_takes_the_output(models):
    # -ts 0,1,1: the layers split over CUDA1 and CUDA2, the output layer's norm on CUDA2; the
    # offload still goes to the first backend, CUDA0. Every CPU input now feeds two splits, but all
    # are still allocated before the embedding rows, so the Host figure is unchanged.
    e = est(models, "wide", f"-c {N_CTX} -ub 64 -ts 0,1,1 {OUT_CPU}", THREE)
    assert e.output_device == "CUDA2" and "CUDA0" not in dict(e.layers)
    output_on_cuda0(STAGED_OUTPUT, 64).check(compute(e, "CUDA0"), "CUDA0")
    Derived(host_offloaded(64)).check(compute(e, "Host"), "Host")


def test_three_gpus_a_device_with_no_work_has_no_buffer(models):
    e = est(models, "wide", f"-c {N_CTX} -ub 128 -ts 0,0,1 {OUT_CPU}", THREE)
    assert dict(e.layers) == {"CUDA2": (0, 1, 2)}
    output_on_cuda0(STAGED_OUTPUT, 128).check(compute(e, "CUDA0"), "CUDA0")
    assert compute(e, "CUDA1") == 0


TIED_CPU = r"-ot ^token_embd\.weight=CPU"


@pytest.mark.parametrize("ub", [32, 512])
def test_tied_output_on_host_stages_token_embd(models, ub):
    # llama-model-loader.cpp create_tensor: the duplicated output is token_embd.weight by name, so
    # the override moves it to the CPU, where it is the input's own tensor; the output matmul is then
    # offloaded with an F16 matrix (no row padding).
    c = ctx_for(ub)
    e = est(models, "tied", f"-c {c} -ub {ub} -ts 0,1 {TIED_CPU}", TWO)
    output_on_cuda0(STAGED_TIED, ub).check(compute(e, "CUDA0"), "CUDA0")
    Derived(host_offloaded(ub, c)).check(compute(e, "Host"), "Host")


def test_tied_output_on_host_without_op_offload(models):
    e = est(models, "tied", f"-c {N_CTX} -ub 128 -ts 0,1 {TIED_CPU} --no-op-offload", TWO)
    assert compute(e, "CUDA0") == 0
    Derived(host_runs_output(128)).check(compute(e, "Host"), "Host")


# --- 2. GGML_OP_OFFLOAD_MIN_BATCH (ggml-cuda.cu ggml_backend_cuda_reg: atoi(getenv(...))) ----------

@pytest.mark.parametrize(("env", "ub", "offloaded"), [
    ("64", 32, False),
    ("64", 64, True),
    ("16", 16, True),
    (" 48 tokens", 32, False),   # atoi: leading blanks, digits, the rest ignored -> 48
    (" 48 tokens", 64, True),
])
def test_offload_threshold_from_the_environment(models, monkeypatch, env, ub, offloaded):
    monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", env)
    e = est(models, "wide", f"-c {N_CTX} -ub {ub} -ts 0,1 {OUT_CPU}", TWO)
    if offloaded:
        output_on_cuda0(STAGED_OUTPUT, ub).check(compute(e, "CUDA0"), "CUDA0")
        Derived(host_offloaded(ub)).check(compute(e, "Host"), "Host")
    else:
        assert compute(e, "CUDA0") == 0
        Derived(host_runs_output(ub)).check(compute(e, "Host"), "Host")


def test_threshold_zero_offloads_the_embedding_lookup_too(models, monkeypatch):
    # atoi("abc") = 0: every batch qualifies, GET_ROWS's 0 included, so the token_embd lookup also
    # moves to CUDA0 (its matrix staged, the same 8.5 MiB as the output's). It is freed, with the
    # inp_tokens copy and the looked-up rows, before the output split, which then starts on an empty
    # arena: CUDA0 = max(staged token_embd + rows, staged output + result_norm + logits) = the latter.
    # The CPU keeps only the inputs.
    monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", "abc")
    e = est(models, "wide", f"-c {N_CTX} -ub 16 -ts 0,1 {OUT_CPU}", TWO)
    output_on_cuda0(STAGED_OUTPUT, 16).check(compute(e, "CUDA0"), "CUDA0")
    Derived(host_inputs(16)).check(compute(e, "Host"), "Host")


# --- 3. the output matrix on the host while CUDA0 also runs layers ---------------------------------
# The output split's staged matrix goes on the tail of CUDA0's arena (no hole the layers leave can
# hold 8.5 MiB), so the arena is at most the layers' allocations plus the output terms; the output
# terms are live together. The layers' part is bounded by layer_bound.

def test_one_gpu_output_on_host(models):
    e = est(models, "wide", f"-c {N_CTX} -ub 32 {OUT_CPU}", ONE)
    assert dict(e.layers) == {"CUDA0": (0, 1, 2)}
    # result_norm's MUL output is CUDA0's own (output_norm is there): the matmul's input, live
    d = Derived(STAGED_OUTPUT + hidden(32) + logits(32), N_LAYER * layer_bound(32) + output_phase_bound(32))
    d.check(compute(e, "CUDA0"), "CUDA0")


def test_two_gpus_split_layers_output_on_host(models):
    e = est(models, "wide", f"-c {N_CTX} -ub 64 -ts 1,1 {OUT_CPU}", TWO)
    layers = dict(e.layers)
    assert e.output_device == "CUDA1"
    n0 = len([il for il in layers.get("CUDA0", ()) if il < N_LAYER])
    # result_norm runs on CUDA1 and crosses to CUDA0 as a split input
    d = Derived(STAGED_OUTPUT + hidden(64) + logits(64), n0 * layer_bound(64) + output_phase_bound(64))
    d.check(compute(e, "CUDA0"), "CUDA0")


# --- 4. partial offload (-ngl below all) -----------------------------------------------------------
# Host layers keep their weights (and KV cache) on the CPU; at T >= 32 every op with a host weight
# (the norms' MULs by nrows, the matmuls by ne[1]) goes to CUDA0 and its weight is staged there, one
# split per weight; their FLASH_ATTN_EXT follows onto CUDA0 in pass 2 and copies the K/V views and
# the mask. All of that is inside layer_bound (staged weights included). What dominates is the
# output phase: the logits, plus the staged output matrix when the output layer is on the CPU too.

def partial(models, argv: str, devices=ONE):
    return est(models, "wide", f"-c {N_CTX} {argv}", devices)


def test_ngl0_every_op_offloaded_output_staged(models):
    e = partial(models, "-ub 32 -ngl 0")
    assert dict(e.layers) == {"CPU": (0, 1, 2)}
    # output_norm's MUL is offloaded too (batch nrows = T), so result_norm is CUDA0's own
    d = Derived(STAGED_OUTPUT + hidden(32) + logits(32), N_LAYER * layer_bound(32) + output_phase_bound(32))
    d.check(compute(e, "CUDA0"), "CUDA0")


def test_ngl1_host_layers_offloaded_output_on_device(models):
    e = partial(models, "-ub 32 -ngl 1")
    assert dict(e.layers) == {"CPU": (0, 1), "CUDA0": (2,)}
    d = Derived(hidden(32) + logits(32), N_LAYER * layer_bound(32) + output_phase_bound(32))
    d.check(compute(e, "CUDA0"), "CUDA0")


def test_ngl2_one_host_layer_at_64_tokens(models):
    e = partial(models, "-ub 64 -ngl 2")
    assert dict(e.layers) == {"CPU": (0,), "CUDA0": (1, 2)}
    d = Derived(hidden(64) + logits(64), N_LAYER * layer_bound(64) + output_phase_bound(64))
    d.check(compute(e, "CUDA0"), "CUDA0")


def test_ngl1_below_32_tokens_only_the_output_phase(models):
    e = partial(models, "-ub 16 -ngl 1")
    d = Derived(hidden(16) + logits(16), hidden(16) + output_phase_bound(16))  # + the crossing l_out
    d.check(compute(e, "CUDA0"), "CUDA0")


@pytest.mark.parametrize("argv", ["-ub 32 -ngl 0 --no-op-offload", "-ub 31 -ngl 0"])
def test_ngl0_without_offload_cuda0_is_idle(models, argv):
    # nothing is assigned to CUDA0 in pass 1, so no sweep can carry it anywhere
    assert compute(partial(models, argv), "CUDA0") == 0


def test_ngl0_two_gpus_offload_goes_to_the_first(models):
    e = partial(models, "-ub 32 -ngl 0", TWO)
    d = Derived(STAGED_OUTPUT + hidden(32) + logits(32), N_LAYER * layer_bound(32) + output_phase_bound(32))
    d.check(compute(e, "CUDA0"), "CUDA0")
    assert compute(e, "CUDA1") == 0


# --- 5. -nkvo ---------------------------------------------------------------------------------------

def test_nkvo_does_not_touch_the_offloaded_output(models):
    # the KV cache and the attention (pinned by build_attn) move to the CPU; CUDA0's only split is
    # the same
    e = est(models, "wide", f"-c {N_CTX} -ub 64 -ts 0,1 {OUT_CPU} -nkvo", TWO)
    output_on_cuda0(STAGED_OUTPUT, 64).check(compute(e, "CUDA0"), "CUDA0")


def test_nkvo_one_gpu_logits_dominate(models):
    # with the attention on the CPU, CUDA0 takes in each layer's attention output instead of the
    # mask and K/V views: still inside layer_bound
    e = est(models, "wide", f"-c {N_CTX} -ub 32 -nkvo", ONE)
    d = Derived(hidden(32) + logits(32), N_LAYER * layer_bound(32) + output_phase_bound(32))
    d.check(compute(e, "CUDA0"), "CUDA0")


# --- 6. MoE experts on the host ---------------------------------------------------------------------
# One qwen3moe layer, everything on CUDA1 (-ts 0,1) but the routed experts on the CPU. The three
# MUL_MAT_IDs (batch ne[2] = n_tokens) go to CUDA0, each in its own split. CUDA0 starts empty:
#   up split: inputs in source order: up_exps copy at 0, the ffn_norm output copy (A_in =
#     [n_embd, 1, T] f32), the selected-experts copy (I32 [n_used, T]); then the up result.
#   gate split: the up copy was freed after its matmul and nothing was allocated since, so the
#     gate copy (same type and shape) takes that hole exactly.
#   down split: the down copy (Q8_0, larger than the gate copy plus A_in, the only holes) must go on
#     the tail, which starts above the selected-experts copy, still live (down reads it).
# So the arena holds S_gate + A_in + sel + S_down at once, and is at most S_up + S_down + every
# other allocation (moe_slack): the gate copy is the one allocation that did not grow it.

def moe_sizes():
    n_embd, n_ff, n_exp = MOE["n_embd"], MOE["n_ff_exp"], MOE["n_expert"]
    up = cuda_alloc(Q.Q4_K, (n_embd, n_ff, n_exp))     # gate_exps is the same
    down = cuda_alloc(Q.Q8_0, (n_ff, n_embd, n_exp))
    return up, down


S_UP, S_DOWN = moe_sizes()
# Q4_K [256, 128, 128]: 16384 rows of one 144-byte block, one padding row of 256 elements (144 B)
assert S_UP == pad(16384 * 144 + 144, 128) == 2_359_552
# Q8_0 [128, 256, 128]: 32768 rows of 4 x 34 bytes, one padding row of 384 elements (12 x 34 B)
assert S_DOWN == pad(32768 * 136 + 408, 128) == 4_456_960


def moe_low(t: int) -> int:
    a_in = f32(MOE["n_embd"], t)
    sel = pad(4 * MOE["n_expert_used"] * t, CUDA_ALIGN)
    return S_UP + a_in + sel + S_DOWN


def moe_slack(t: int) -> int:
    """Everything else CUDA0 can allocate: up, gate, the activation (silu and mul, or one swiglu)
    [n_ff_exp, n_used, T] f32: 4; the down result and the weighted experts [n_embd, n_used, T]: 2;
    the router weights copy [1, n_used, T]; the expert sum's adds, the residual input copy, the
    residual add and the next rms_norm [n_embd, T]: n_used - 1 + 3; 128 bytes of alignment each."""
    n_embd, n_ff, n_used = MOE["n_embd"], MOE["n_ff_exp"], MOE["n_expert_used"]
    return (4 * f32(n_ff, n_used, t) + 2 * f32(n_embd, n_used, t) + f32(1, n_used, t)
            + (n_used - 1 + 3) * f32(n_embd, t) + 20 * CUDA_ALIGN)


@pytest.mark.parametrize(("argv", "model"), [
    ("-ub 32 -ot exps=CPU", "moe"),
    ("-ub 64 -ot exps=CPU", "moe"),
    ("-ub 32 -ncmoe 1", "moe"),
    ("-ub 32 -ncmoe 1", "moe2"),    # only layer 0's experts; layer 1's stay on CUDA1
])
def test_moe_experts_on_host_staged_on_cuda0(models, argv, model):
    t = int(argv.split()[1])
    e = est(models, model, f"-c {N_CTX} -ts 0,1 {argv}", TWO)
    Derived(moe_low(t), moe_slack(t)).check(compute(e, "CUDA0"), "CUDA0")


@pytest.mark.parametrize(("argv", "env"), [
    ("-ub 31 -ot exps=CPU", None),
    ("-ub 64 -ot exps=CPU --no-op-offload", None),
    # MUL_MAT_ID's batch is ne[2] = 32 tokens, under 33; its rows (ne[1] x ne[2] = 64) would pass
    ("-ub 32 -ot exps=CPU", "33"),
])
def test_moe_experts_stay_on_host(models, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", env)
    e = est(models, "moe", f"-c {N_CTX} -ts 0,1 {argv}", TWO)
    assert compute(e, "CUDA0") == 0


# --- 7. pipeline parallelism (two GPUs, every layer offloaded, no override) -------------------------
# llama-context.cpp: pipeline_parallel when n_devices > 1, n_gpu_layers > n_layer_all, layer split,
# offload_kqv, no tensor overrides (CUDA reports async and events). With n_copies = 4 every split
# input gets 4 copies, added as leafs (allocated first) and flagged output (never freed)
# (ggml-backend.cpp split_graph, "add input copies as leafs"). With -ts 1,1 both layers land on
# CUDA0 and CUDA1 runs only the output layer: its one input is the hidden state from CUDA0 (4
# copies); RMS_NORM cannot work in place over an output-flagged copy, its MUL by output_norm works
# in place over the RMS_NORM result (ggml_op_can_inplace: MUL; its only child), then the logits.

@pytest.mark.parametrize("ub", [32, 512])
def test_pipeline_parallel_output_device_holds_four_copies(models, ub):
    c = ctx_for(ub)
    e = est(models, "wide", f"-c {c} -ub {ub} -ts 1,1", TWO)
    assert e.pipeline_parallel and dict(e.layers) == {"CUDA0": (0, 1), "CUDA1": (2,)}
    Derived(4 * hidden(ub) + hidden(ub) + logits(ub)).check(compute(e, "CUDA1"), "CUDA1")


# --- 8. plans under tight budgets -------------------------------------------------------------------
# Whatever placement the planner picks for the wide model, each device's compute is bounded by the
# terms above: layer_bound per layer it runs (or offloads from the host), the output phase where
# the output matmul runs, and under pipeline parallelism four never-freed copies of every input.

def wide_derived(e, name: str) -> Derived:
    """The wide model's compute on device `name` for any placement (the prompt graph; the one-token
    graph's terms are the same or smaller)."""
    t, n_kv = min(e.cparams.n_ctx, e.cparams.n_ubatch), e.cparams.n_ctx
    layers = dict(e.layers)
    first = e.devices[0].name
    out_host = e.output_device == "CPU" or any(tensor == "output.weight" for tensor, _ in e.moved)
    offloading = e.flags.op_offload and t >= 32
    n_here = len([il for il in layers.get(name, ()) if il < N_LAYER])
    n_host = len([il for il in layers.get("CPU", ()) if il < N_LAYER])
    low, slack = 0, n_here * layer_bound(t, n_kv)
    if name == first and offloading:
        slack += n_host * layer_bound(t, n_kv)
    if (out_host and offloading and name == first) or (not out_host and e.output_device == name):
        low += logits(t) + hidden(t) + (STAGED_OUTPUT if out_host else 0)
        slack += output_phase_bound(t)
    if e.pipeline_parallel:
        slack += 4 * (host_inputs(t, n_kv) + 2 * hidden(t))
    return Derived(low, slack)


# each budget holds its rows' room (43 MiB, ...) and the device's CUDA overhead (tests/support/overhead.py)
@pytest.mark.parametrize(("devices", "max_vram", "ub"), [
    (ONE, f"CUDA0={cuda(43)}", 64),
    (ONE, f"CUDA0={cuda(30)}", 32),
    (TWO, f"CUDA0={cuda(43)},CUDA1={cuda(20)}", 64),
    (THREE, f"CUDA0={cuda(10)},CUDA1={cuda(10)},CUDA2={cuda(43)}", 64),
    (TWO, f"CUDA0={cuda(30)},CUDA1={cuda(30)}", 64),
])
def test_plans_fit_their_budgets_by_derivation(models, devices, max_vram, ub):
    # a plan sizes what its llama-server line loads (PLANNED_PROGRAM); its flags' dry run is the derived figure
    result = plan(models["wide"], as_inventory(devices, ram="64GiB"), PlanRequest(n_ctx=N_CTX, n_ubatch=ub),
                  max_vram=max_vram)
    served = estimate(models["wide"], llama_argv(result), result.inventory, program=PLANNED_PROGRAM)
    assert served.devices == result.estimate.devices
    e = estimate(models["wide"], llama_argv(result), result.inventory)
    for dev in e.devices:
        if dev.name not in result.budgets.devices:
            continue
        d = wide_derived(e, dev.name)
        assert d.low <= dev.compute_bytes <= d.low + d.slack, (dev.name, dev.compute_bytes, d)
        loaded = next(x for x in served.devices if x.name == dev.name)
        assert loaded.compute_bytes <= dev.compute_bytes, dev.name   # llama-server reserves fewer output rows
        assert loaded.held_bytes <= result.budgets.devices[dev.name], \
            (dev.name, loaded, result.budgets.devices[dev.name])
        assert loaded.overhead_bytes == CUDA_MIB * MiB
    assert result.budgets.devices["CUDA0"] < 1 * GiB
