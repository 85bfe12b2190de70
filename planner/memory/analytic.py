"""The closed-form compute model: the solver's first filter, and the figure for architectures the
runtime has no graph builder for (outputs then say `compute_model: formula`).

What the pinned llama.cpp reserves (src/llama-context.cpp sched_reserve, ggml-backend.cpp, ggml-alloc.c):
- the worst-case graph has T = min(n_ctx, n_ubatch) tokens and min(T, n_batch) outputs;
- graph inputs (tokens, positions, KQ masks, cache row indices, output ids) live on the CPU
  backend; each device copies in the inputs its layers read, plus the hidden state crossing from
  the previous device (seed 000: "what an input means to a split");
- with pipeline parallelism every graph input and every crossing copy exists n_copies = 4 times
  and is never freed (seed 000 §"Four copies");
- inside a device the allocator frees a tensor after its last use and runs norms, ropes, adds and
  softmax in place, so a layer's peak is roughly the residual stream, one normed copy and the
  FFN's up/gate/activation rows — or, without flash attention, the n_kv x T x n_head scores;
- the output device also holds the logits, n_vocab x outputs f32.
Terms are counted in bytes; a small per-device constant covers graph bookkeeping tensors.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from planner.core.units import pad
from planner.llama.placement import CPU, HOST, HOST_ROWS, Placement, WeightOp, row_of
from planner.llama.settings import LlamaSettings
from planner.model.arch import AttnKind, ModelFacts
from planner.model.shapes import Shapes
from planner.model.tensors import OUTPUT, is_dense_ffn_projection, layer_of
from runtime.engine.reserve import reserve_compute
from runtime.ggml.profiles import GGML_SCHED_MAX_COPIES, op_offload_min_batch

F32 = 4
F16 = 2
I32 = 4
I64 = 8


# Terms of this model fitted to llama.cpp's output rather than derived from its source: each is
# named here, once, with the measurement it came from. The runtime's reserve (runtime/engine/reserve.py)
# replaces the whole model wherever a graph builder exists; these terms remain only for the rest.
FITTED_TERMS: dict[str, str] = {
    "routed-expert FFN peak (_ffn_work)": "llama-fit-params on Qwen3-30B-A3B / DeepSeek-V2-Lite shapes "
        "(bench/bench_estimate_accuracy.py): 2 residual + 3 expert-width rows, + the down rows without shared experts",
    "no-FA extra V copy (_layer_work)": "llama-fit-params on a Granite-4.0-H-class hybrid, n_ctx 4096..131072",
    "recurrent boundary crossings (_boundary_crossings)": "GGML_SCHED_DEBUG=2 splits on a Mamba-2 hybrid",
    "expert rows back on the device (_moved_to_cpu_work)":
        "llama-fit-params with -ot exps=CPU / -ncmoe on Qwen3 MoE",
    "pulled attention cores (_pulled_cores)":
        "llama-fit-params on a Granite-4.0-H-class hybrid, -ub 32..512, within 1 %",
    "deepseek2 one-sequence output phase": "llama-fit-params on DeepSeek-V2-Lite, -np 1 against -np 2",
    "pipeline arena fragmentation (+2 hidden rows)": "llama-fit-params with two rpc-servers, every layer offloaded",
}

def _ffn_work(sh: Shapes, t: int) -> int:
    """FFN peak, calibrated against llama-fit-params (bench/bench_estimate_accuracy.py).

    Dense SwiGLU/GeGLU: the residual plus up, gate and activation rows. Routed experts also hold the
    down projection's n_embd x n_expert_used rows (it does not fit the freed up/gate hole) — except
    with shared experts, where the measured peak stays at the up/gate/activation level.
    """
    e = sh.n_embd * t * F32
    dense = e + 3 * sh.n_ff * t * F32
    if not sh.n_ff_moe:
        return dense
    f, d = sh.n_ff_moe * t * F32, sh.n_embd * sh.n_expert_used * t * F32
    moe = 2 * e + 3 * f + (0 if sh.shared_experts else d)
    return max(dense, moe)


def _layer_work(sh: Shapes, kind: AttnKind, n_kv: int, t: int, fa: bool, n_stream: int) -> int:
    """Peak live bytes while one layer runs on a device."""
    e = sh.n_embd * t * F32
    ffn = _ffn_work(sh, t)
    attn = 2 * e + (sh.q_width + 2 * sh.kv_width) * t * F32
    if kind in (AttnKind.FULL, AttnKind.SWA) and not fa:
        scores = n_kv * (t // max(1, n_stream)) * n_stream * sh.n_head * F32
        attn = e + sh.q_width * t * F32 + scores + sh.q_width * t * F32
        # measured (granite hybrid, n_ctx 4096..131072): one more V-sized copy, its transposed view made contiguous
        attn += n_kv * sh.kv_width * F16
    if kind is AttnKind.RECURRENT and sh.ssm_in:
        # Mamba-2 mixer: in_proj output, the padded conv input and output, the scan output
        attn = 2 * e + (sh.ssm_in + 2 * sh.ssm_conv + sh.ssm_inner) * t * F32
    return max(ffn, attn)


def _mask_bytes(n_kv: int, t: int, fa: bool) -> int:
    return n_kv * t * (F16 if fa else F32)


def _boundary_crossings(facts: ModelFacts, sh: Shapes, placement: Placement, t: int) -> dict[str, int]:
    """Extra tensors crossing where a recurrent layer ends a device's range.

    Measured with GGML_SCHED_DEBUG: the scheduler runs part of that Mamba-2 mixer on the next
    device, so its in_proj output crosses forward and the scan output crosses back.
    """
    out: dict[str, int] = defaultdict(int)
    if not sh.ssm_in:
        return out
    devs = placement.layer_device
    for lf in facts.layers:
        il = lf.index
        if lf.nextn or lf.kind is not AttnKind.RECURRENT or il + 1 >= len(devs) - 1:
            continue
        here, nxt = devs[il], devs[il + 1]
        if here != nxt and "CPU" not in (here, nxt):
            out[nxt] += sh.ssm_in * t * F32
            out[here] += sh.ssm_inner * t * F32
    return out


def _moved_to_cpu_work(sh: Shapes, placement: Placement, t: int) -> tuple[int, set[int]]:
    """Work the CPU takes over when overrides keep an offloaded layer's FFN weights in host memory.

    The scheduler runs a matmul where its weight lives, so the CPU computes those FFN parts
    (routed experts: the whole expert block; dense: the moved projections) and the device gets
    the expert rows back (measured: the weighting by router probabilities stays on the device).
    Returns the CPU's work and the layers whose routed experts moved.
    """
    e, f_dense, f_moe = sh.n_embd * t * F32, sh.n_ff * t * F32, sh.n_ff_moe * t * F32
    d = sh.n_embd * sh.n_expert_used * t * F32
    experts: set[int] = set()
    dense: dict[int, int] = defaultdict(int)
    for name, row in placement.tensor_buft:
        if row not in HOST_ROWS:
            continue
        il, suffix = layer_of(name)
        if il is None or placement.layer_device[il] == CPU:
            continue
        # "_exps" only, as when the term was fitted: grovemoe's chunked experts (_chexps) are not counted
        if "_exps" in suffix:
            experts.add(il)
        elif is_dense_ffn_projection(suffix):
            dense[il] += 1
    host = max([2 * e + 3 * f_moe + (0 if sh.shared_experts else d)] if experts else [0])
    host = max([host] + [e + k * f_dense for k in dense.values()])
    return host, experts


def _pulled_cores(settings: LlamaSettings, sh: Shapes, t: int) -> dict[str, int]:
    """The attention cores settings.pulled_attention moves onto a device, sized from llama-fit-params on a
    Granite-4.0-H-class hybrid (n_ctx 4096..131072, -ub 32..512, within 1 %): the K and V views
    and the mask copied in, plus the fused op's Q and output rows — or, without flash attention,
    the scores and a second V copy (its transposed view made contiguous)."""
    out: dict[str, int] = defaultdict(int)
    for il, dev in settings.pulled.items():
        n_kv = settings.kv_cells.get(settings.ctx.facts.layers[il].kind, 0)
        view = n_kv * sh.kv_width * F16
        if settings.cparams.flash_attn:
            core = 2 * view + n_kv * t * F16 + 2 * sh.q_width * t * F32
        else:
            core = 3 * view + n_kv * t * F32 + n_kv * t * sh.n_head * F32 + sh.q_width * t * F32
        out[dev] = max(out[dev], core)
    return out


def _output_row(placement: Placement) -> str:
    """Where the logits are computed: beside the output matrix (seed 000's 1.wgt rule), which an
    -ot rule can keep in host memory while the output layer itself is offloaded."""
    row = dict(placement.tensor_buft).get(OUTPUT)
    if row is None and dict(placement.moved).get(OUTPUT) == CPU:
        row = HOST  # a tied duplicate sent to the CPU shares token_embd's host copy
    if row is None:
        row = row_of(placement.layer_device[-1])
    return HOST if row in HOST_ROWS else row


SIMULATED = "simulated"   # the runtime's scheduler and allocator reserve (runtime/engine/reserve.py)
FORMULA = "formula"       # this module's closed form (no graph builder for the architecture or cparams)


def compute_model(settings: LlamaSettings, use_runtime: bool = True,
                  n_outputs_max: int | None = None, dry_run: bool = True) -> tuple[dict[str, int], str]:
    """Compute bytes per buffer row (device names and Host), and which model gave them: the
    runtime's replay of the allocator's reserve where a graph builder exists (SIMULATED), else the
    closed form below (FORMULA); `use_runtime=False` asks for the closed form alone (fast: the
    planner's search filters with it). `n_outputs_max`: the context's output rows (llama_context
    cparams.n_outputs_max: a drafter's is -np, planner.llama.companions); None is n_batch, as
    llama-fit-params and llama-cli reserve. `dry_run`: llama-fit-params' reserve, or (False) what a
    real load allocates (runtime/engine/runner.py ModelRunner.reserve).

    The closed form, per row: what is never freed (pipeline copies; the unused embeddings input on
    the CPU) plus the larger of the layer phase (inputs still read + the worst layer) and the output
    phase (logits + the normed and last hidden rows), since the allocator frees the masks before the
    output matmul runs."""
    if use_runtime:
        measured = reserve_compute(settings, n_outputs_max, dry_run)
        if measured is not None:
            return measured, SIMULATED
    return _analytic_compute_bytes(settings, n_outputs_max), FORMULA


def _staged_floor(settings: LlamaSettings, t: int, n_out: int) -> tuple[str, int] | None:
    """Seed 000 1.off, as a floor: with op offload, a prompt batch of at least the offload batch runs
    each matmul whose weight is in host memory on the first device whose backend offloads, and that
    device's compute buffer holds the copied weight (its get_alloc_size) and the op's result at once.
    The largest such pair is a lower bound of that buffer. (device row, bytes), or None."""
    if not settings.flags.op_offload or t < op_offload_min_batch():
        return None
    first = next((d for d in settings.devices if d.profile.offload_op), None)
    if first is None:
        return None
    slots = settings.ctx.slot_by_name
    floor = 0
    for name, row in settings.placement.tensor_buft:
        s = slots[name]
        if row not in HOST_ROWS or s.op not in (WeightOp.MUL_MAT, WeightOp.MUL_MAT_ID):
            continue
        weight = pad(settings.alloc_size(first.name, s.ggml_type, s.ne0, s.n_bytes), first.alignment)
        tokens = n_out if name == OUTPUT else t
        used = settings.ctx.facts.n_expert_used if s.op is WeightOp.MUL_MAT_ID else 1
        floor = max(floor, weight + s.rows * used * tokens * F32)
    return (first.name, floor) if floor else None


def _worst_layer_work(settings: LlamaSettings, t: int, scores: bool = True) -> dict[str, int]:
    """Per buffer row, the peak live bytes of the worst layer it runs (Host: also the work overrides
    move to the CPU, and any pulled attention core). `scores=False`: without flash attention's
    n_kv x T x n_head score matrix (sized as flash attention's working set)."""
    ctx, cp, placement = settings.ctx, settings.cparams, settings.placement
    sh, cells = ctx.shapes, settings.kv_cells
    e = sh.n_embd * t * F32
    host_moved, experts_moved = _moved_to_cpu_work(sh, placement, t)
    work: dict[str, int] = defaultdict(int)
    for lf in ctx.facts.layers:
        if lf.nextn:
            continue
        row = row_of(placement.layer_device[lf.index])
        on_device = sh if lf.index not in experts_moved else replace(sh, n_ff_moe=0)
        layer = _layer_work(on_device, lf.kind, cells.get(lf.kind, 0), t, cp.flash_attn or not scores, cp.n_stream)
        if lf.index in experts_moved:  # the expert rows come back for weighting and summing
            layer = max(layer, 2 * e + sh.n_embd * sh.n_expert_used * t * F32)
        work[row] = max(work[row], layer)
    work[HOST] = max(work[HOST], host_moved)
    if scores:
        for row, core in _pulled_cores(settings, sh, t).items():
            work[row] = max(work[row], core)
    return work


def _graph_inputs(settings: LlamaSettings, t: int, n_out: int) -> int:
    """Bytes of the graph's inputs: llm_graph_input_embd's token ids and its f32 embeddings input (unused
    for text, still allocated), the positions, the output ids, and per cache kind a mask and the K/V
    row indices."""
    cp = settings.cparams
    per_kind = sum(_mask_bytes(n, t, cp.flash_attn) + 2 * t * I64 for n in settings.kv_cells.values())
    return settings.ctx.shapes.n_embd * t * F32 + 2 * t * I32 + n_out * I32 + per_kind


def formula_safety(settings: LlamaSettings, n_outputs_max: int | None = None) -> dict[str, int]:
    """The safety term a formula estimate carries, per buffer row: the larger of the worst layer's
    working set on that row (as flash attention's, without the score matrix, which the formula sizes
    from its definition) and the graph's inputs, once more.

    The formula is not a proven bound of llama.cpp's reserve: its layer phase is fitted
    (FITTED_TERMS) on the architectures it was measured on, and a graph it was not measured on keeps
    more alive at once (an extra norm, scale, gating or routing tensor, a copy made contiguous, another
    copy of an input). On the architectures without a graph builder the estimate adds this term to
    every row; the outputs say so. Where a graph builder exists the simulated reserve replaces the
    whole formula and no term is added."""
    cp = settings.cparams
    t = min(cp.n_ctx, cp.n_ubatch)
    inputs = _graph_inputs(settings, t, min(t, n_outputs_max or cp.n_batch))
    work = _worst_layer_work(settings, t, scores=False)
    rows = set(work) | {HOST, _output_row(settings.placement)}
    return {row: max(work.get(row, 0), inputs) for row in rows}


def _analytic_compute_bytes(settings: LlamaSettings, n_outputs_max: int | None = None) -> dict[str, int]:
    ctx, cp, placement = settings.ctx, settings.cparams, settings.placement
    sh = ctx.shapes
    t = min(cp.n_ctx, cp.n_ubatch)
    n_out = min(t, n_outputs_max or cp.n_batch)
    pipeline = placement.pipeline_parallel
    copies = GGML_SCHED_MAX_COPIES if pipeline else 1
    cells = settings.kv_cells
    per_kind = {k: _mask_bytes(n, t, cp.flash_attn) + 2 * t * I64 for k, n in cells.items()}
    e = sh.n_embd * t * F32
    graph_inputs = _graph_inputs(settings, t, n_out)
    work = _worst_layer_work(settings, t)
    kinds = _cached_kinds_by_row(settings)
    out_row = _output_row(placement)
    extra = _boundary_crossings(ctx.facts, sh, placement, t)
    output_phase = _output_phase_bytes(settings, n_out)
    rows: dict[str, int] = {}
    for row in set(work) | {HOST, out_row}:
        if row == HOST:
            held = graph_inputs * copies if pipeline else e
            live = (0 if pipeline else graph_inputs - e) + e  # + the token embeddings gathered on the CPU
            out = output_phase
        else:
            crossing = e + 2 * t * I32 + sum(per_kind[k] for k in kinds[row]) + extra.get(row, 0)
            held, live, out = _device_row_phases(crossing, e, output_phase, copies if pipeline else 0)
        layers = live + work[row] if (row in work or row == HOST) else 0
        rows[row] = held + max(layers, out if row == out_row else 0)
    staged = _staged_floor(settings, t, n_out)
    if staged is not None:
        rows[staged[0]] = max(rows.get(staged[0], 0), staged[1])
    return rows


def _cached_kinds_by_row(settings: LlamaSettings) -> dict[str, set[AttnKind]]:
    """The attention kinds with a KV cache among each buffer row's trunk layers."""
    kinds: dict[str, set[AttnKind]] = defaultdict(set)
    for lf in settings.ctx.facts.layers:
        if not lf.nextn and lf.kind in settings.kv_cells:
            kinds[row_of(settings.placement.layer_device[lf.index])].add(lf.kind)
    return kinds


def _output_phase_bytes(settings: LlamaSettings, n_out: int) -> int:
    """The output phase's arena: the logits and two hidden rows per output token."""
    sh, facts = settings.ctx.shapes, settings.ctx.facts
    output_phase = sh.n_vocab * n_out * F32 + 2 * sh.n_embd * n_out * F32
    if sh.n_ff_moe and sh.shared_experts and settings.cparams.n_seq == 1:
        # measured (deepseek2): with one sequence the last layer's expert rows stay below the
        # logits in the arena; with two or more they do not
        output_phase += sh.n_embd * facts.n_expert_used * n_out * F32
    return output_phase


def _device_row_phases(crossing: int, e: int, output_phase: int, copies: int) -> tuple[int, int, int]:
    """(held, live, output phase) bytes of a device's row: `crossing` is what enters it from the previous
    split; with pipeline parallelism (`copies` > 0) it is held `copies` times."""
    if not copies:
        return 0, crossing, output_phase
    # measured: behind the four held copies the arena fragments by about two more hidden rows
    return crossing * copies, 2 * e, output_phase + e
