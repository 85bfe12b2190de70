"""Predicted decode and prefill speed of a placement (the derivation: docs/internals/throughput.md).

Decode (batch 1) is memory-bound and llama.cpp runs a layer split's stages one after another:

    t_token = sum_d (R_d / BW_d + Attn_d + Kn_d · tau_d)  +  sum_boundaries (A / L_b + lat_b)
    R_d = sum_{l on d} (W_l - E_l + f·E_l),  f = n_expert_used / n_expert,  A = n_embd · 4 bytes
    Attn_d = max(Sw_d / Bsweep_d, K_d / BW_d),  Sw_d = sum_{l on d} n_head_l · n_kv_l · (K + V bytes of a cell)

R_d the weight bytes a token reads on d, Sw_d the cache rows its query heads sweep (llama.cpp keeps every KV head
of a cell in one row; ggml's flash attention walks the cells per query head), K_d the cache bytes, Kn_d the op
nodes the scheduler put on a GPU device (one kernel launch each) and tau_d its time per node. Experts or FFNs kept
in host memory are read at the host's bandwidth and add two boundaries a layer.

Prefill (a ubatch of B tokens) is mostly compute-bound:

    t_ubatch = sum_d (2·B·P_d / F_d + Att_d / Fatt_d + S_d / BW_d)  +  offloaded host weights / link

with op offload at B >= 32 (seed 000 §1.off, ggml-backend.cpp) and, under llama.cpp's pipeline parallelism
(llama_context), U ubatches of a batch overlapping: t_batch = t_ubatch + (U - 1) · max_d t_d.
Rates per device: calibrated (`fitplan calibrate`), else stated (catalog, inventory), else assumed (below);
`Prediction.rate_sources` says which.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from planner.hardware.inventory import DeviceSpec, Inventory, Quantity
from planner.llama.context import ModelContext
from planner.llama.placement import CPU
from planner.memory.estimate import Estimate
from planner.model.arch import ModelFacts
from planner.model.costs import CostTable, LayerCost, WeightGroup, tensor_group
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD
from runtime.ggml.profiles import PROFILES, Backend, op_offload_min_batch

# Activations cross a boundary in f32 (ggml graphs carry the residual stream in f32).
ACTIVATION_BYTES_PER_VALUE = 4
# Fixed cost of a split boundary: a backend synchronisation and a small copy. Assumed figures:
# ~15 µs across PCIe on one host, ~100 µs for an rpc-server over a network round trip.
LOCAL_SPLIT_LATENCY_S = 15e-6
RPC_SPLIT_LATENCY_S = 100e-6
# When a device does not state its rates, decode/prefill are predicted from these, and the
# prediction says so.
FALLBACK_HOST_BANDWIDTH = 50e9      # dual-channel DDR5 class
FALLBACK_DEVICE_BANDWIDTH = 300e9   # a mid-range GPU: an unknown device is assumed faster than the host
FALLBACK_FLOPS = 1e12
FALLBACK_LINK = 16e9                # PCIe 4.0 x8 class
# Seconds per op node of a decoded token's graph on a GPU backend (a kernel each), unless calibrated: the lent
# H200's figure (bench/bench_gpu_throughput.py, the least-squares fit over the record's rows with every layer on the
# GPU of seconds per token = bytes / B + op nodes x tau). Measured on that one GPU; on others an assumption.
FALLBACK_KERNEL_S = 1.36e-6

# Where a rate came from (Prediction.rate_sources), best first.
CALIBRATED = "calibrated"   # measured on the machine (`fitplan calibrate`)
STATED = "stated"           # the inventory's figure (a catalog entry's or the file's)
ASSUMED = "assumed"         # one of the fallbacks above


@dataclass(frozen=True)
class PlacementView:
    """What the throughput model needs of a placement (kept independent of flag parsing)."""

    layer_device: tuple[str, ...]      # device name of each trunk layer, `CPU` for host layers
    output_device: str                 # where the output matrix (and logits) live
    experts_on_host: frozenset[int]    # layers whose routed experts stay in host memory
    n_ctx: int
    n_ubatch: int = 512
    n_seq: int = 1
    output_on_host: bool = False       # `-ot` keeps the output matrix (and the logits) in host memory
    op_offload: bool = True            # `--no-op-offload` clears it
    n_past: int | None = None          # cells already in the cache (llama-bench -d); None: a full context
    ffn_on_host: frozenset[int] = frozenset()   # dense layers whose FFN weights `-ot` keeps in host memory
    pipeline: bool = False             # llama.cpp's pipeline parallelism (placement.pipeline_parallel)
    n_batch: int = 0                   # prompt tokens one llama_decode takes (min(-b, -c, the prompt)); 0: one ubatch
    kernels: tuple[tuple[str, int], ...] = ()   # per device, the one-token graph's op nodes (Estimate.decode_kernels)

    @property
    def n_ubatches(self) -> int:
        """The ubatches one llama_decode of a prompt is cut into (what pipeline parallelism overlaps)."""
        return -(-self.n_batch // self.n_ubatch) if self.n_batch > self.n_ubatch else 1

    def host_ffn(self, layer: int) -> bool:
        """Whether a layer's FFN (routed experts, or a dense layer's FFN) reads host memory while the layer
        itself is on a device: its activation goes to the CPU and back."""
        return layer in self.experts_on_host or layer in self.ffn_on_host


@dataclass(frozen=True)
class StageTime:
    device: str
    bytes_per_token: int        # weights and KV cache
    seconds_per_token: float
    kv_bytes_per_token: int = 0   # of which the KV cache attention reads

    @property
    def weight_bytes_per_token(self) -> int:
        return self.bytes_per_token - self.kv_bytes_per_token


@dataclass(frozen=True)
class Prediction:
    decode_tokens_s: float
    prefill_tokens_s: float
    stages: tuple[StageTime, ...]
    n_boundaries: int
    assumed_rates: bool   # some device had no bandwidth/FLOPs figure; fallbacks were used
    rate_sources: tuple[str, ...] = ()   # which of CALIBRATED, STATED, ASSUMED the rates came from

    @property
    def calibrated(self) -> bool:
        return CALIBRATED in self.rate_sources


def expert_fraction(n_expert: int, n_used: int) -> float:
    return n_used / n_expert if n_expert else 0.0


def layer_decode_bytes(layer: LayerCost, n_ctx: int, expert_fraction: float, n_seq: int = 1) -> tuple[int, int]:
    """(bytes read from the layer's device, bytes of routed experts read) for one decoded token."""
    dense, experts = layer_weight_bytes(layer, expert_fraction, n_seq)
    return dense + layer_kv_bytes(layer, n_ctx), experts


def layer_weight_bytes(layer: LayerCost, expert_fraction: float, n_seq: int = 1) -> tuple[int, int]:
    """layer_decode_bytes without the KV cache: (dense weights and recurrent state, routed experts read)."""
    experts = layer.group_bytes(WeightGroup.EXPERTS)
    return layer.weight_bytes - experts + layer.state_bytes_per_seq * n_seq, int(experts * expert_fraction)


def layer_kv_bytes(layer: LayerCost, n_ctx: int) -> int:
    """The KV cache one decoded token's attention reads in a layer: n_ctx cells, at most the window."""
    n_kv = min(n_ctx, layer.window) if layer.window else n_ctx
    return layer.kv_bytes_per_cell * n_kv


class Rates:
    """Bandwidth, FLOPs, link and hand-off latency of each device by name; the host is `CPU`.
    A calibrated figure wins over a stated one, a stated one over an assumption."""

    def __init__(self, inventory: Inventory) -> None:
        self.devices: dict[str, DeviceSpec] = {d.name: d for d in inventory.devices}
        self.host = inventory.host
        self.calibration = inventory.calibration
        # ggml's op offload moves a host-weight matmul to the highest-priority device that wants it
        self.first_device = next((d.name for d in inventory.devices if PROFILES[d.backend].offload_op), None)
        self.sources: set[str] = set()

    @property
    def assumed(self) -> bool:
        return ASSUMED in self.sources

    def bandwidth(self, name: str) -> float:
        """Bytes/s the device streams weights at: calibrated, else stated — what llama.cpp's decode was measured to
        stream at on this product (a catalog entry's `measured:`), else the memory's bandwidth — else assumed."""
        if name == CPU:
            stated = self.host.bandwidth_bytes_s
        else:
            dev = self.devices[name]
            stated = dev.stream_bytes_s or dev.bandwidth_bytes_s
        fallback = FALLBACK_HOST_BANDWIDTH if name == CPU else FALLBACK_DEVICE_BANDWIDTH
        return self._rate(name, Quantity.BANDWIDTH, stated, fallback)

    def flops(self, name: str) -> float:
        stated = self.host.fp16_flops if name == CPU else self.devices[name].fp16_flops
        return self._rate(name, Quantity.FLOPS, stated, FALLBACK_FLOPS)

    def attention_seconds(self, name: str, kv_bytes: float, work: AttentionWork) -> float:
        """A decoded token's attention on this device: `work` (its (query head, cached cell) pairs, the K and V
        values of those pairs, the cache rows its query heads sweep) over `kv_bytes` of cache. With a calibrated
        sweep rate it is the swept bytes at that rate; calibrated per pair (and, from two head widths, per
        value: calibrations before the sweep), the pairs and values at those rates — either never faster than
        the cache's bytes at the device's bandwidth; else the bytes at a calibrated attention bandwidth (older
        calibrations), else at the device's bandwidth."""
        if not kv_bytes and not work.pairs:
            return 0.0
        sweep = self._attention(name, Quantity.ATTENTION_SWEEP)
        if sweep:
            return max(work.swept / sweep, kv_bytes / self.bandwidth(name))
        per_pair = self._attention(name, Quantity.ATTENTION_CELLS)
        per_value = self._attention(name, Quantity.ATTENTION_VALUES)
        if per_pair or per_value:
            seconds = (work.pairs / per_pair if per_pair else 0.0) + (work.values / per_value if per_value else 0.0)
            return max(seconds, kv_bytes / self.bandwidth(name))
        return kv_bytes / (self._attention(name, Quantity.ATTENTION_BANDWIDTH) or self.bandwidth(name))

    def kernel_time(self, name: str) -> float:
        """Seconds per op node of a decoded token's graph on this device beyond its bytes, where the device (or the
        backend an rpc-server runs) launches a GPU kernel for each node: calibrated, else measured on the product
        (stated), else FALLBACK_KERNEL_S; 0 for the host, CPU rpc-servers and rpc-servers of unknown backend."""
        dev = self.devices.get(name)
        backend = None if dev is None else dev.remote_backend if dev.backend is Backend.RPC else dev.backend
        if dev is None or backend is None or backend in (Backend.CPU, Backend.RPC):
            return 0.0
        return self._rate(name, Quantity.KERNEL_TIME, dev.kernel_seconds, FALLBACK_KERNEL_S)

    def attention_flops(self, name: str) -> float:
        """The FLOP/s of a prompt's attention: calibrated, else the device's FLOPs."""
        return self._attention(name, Quantity.ATTENTION_FLOPS) or self.flops(name)

    def _attention(self, name: str, quantity: Quantity) -> float | None:
        measured = self.calibration.figure(name, quantity) if self.calibration else None
        if measured:
            self.sources.add(CALIBRATED)
        return measured

    def link(self, name: str) -> float:
        """Bytes/s between this device and the host (a huge figure for the host itself)."""
        if name == CPU:
            return float("inf")
        return self._rate(name, Quantity.LINK, self.devices[name].transfer_bytes_s, FALLBACK_LINK)

    def device_latency(self, a: str, b: str) -> float:
        """A boundary between two devices: the larger calibrated device-to-device latency of the two, else the
        per-split hand-off latency of either side."""
        measured = [m for dev in (a, b)
                    if self.calibration and (m := self.calibration.figure(dev, Quantity.DEVICE_LATENCY)) is not None]
        if measured:
            self.sources.add(CALIBRATED)
            return max(measured)
        return max(self.latency(a), self.latency(b))

    def latency(self, name: str) -> float:
        """The per-split hand-off latency of a boundary on this device's side: a calibrated figure, else
        the assumed constants (which are not counted as an assumed rate: they are never stated)."""
        measured = self.calibration.figure(name, Quantity.SPLIT_LATENCY) if self.calibration else None
        if measured is not None:
            self.sources.add(CALIBRATED)
            return measured
        dev = self.devices.get(name)
        return RPC_SPLIT_LATENCY_S if dev is not None and dev.endpoint else LOCAL_SPLIT_LATENCY_S

    def _rate(self, name: str, quantity: Quantity, stated: float, fallback: float) -> float:
        measured = self.calibration.figure(name, quantity) if self.calibration else None
        if measured:
            self.sources.add(CALIBRATED)
            return measured
        if stated:
            self.sources.add(STATED)
            return stated
        self.sources.add(ASSUMED)
        return fallback

    @property
    def source_list(self) -> tuple[str, ...]:
        return tuple(s for s in (CALIBRATED, STATED, ASSUMED) if s in self.sources)


def _boundary_seconds(rates: Rates, a: str, b: str, act_bytes: float) -> float:
    """One split boundary: the per-split hand-off latency (a synchronisation of the two backends,
    a round trip for an rpc-server) plus the boundary copy of `act_bytes` over the slower link."""
    link = min(rates.link(a), rates.link(b))
    handoff = rates.device_latency(a, b) if CPU not in (a, b) else max(rates.latency(a), rates.latency(b))
    return act_bytes / link + handoff


def boundaries(costs: CostTable, view: PlacementView) -> list[tuple[str, str]]:
    """The split boundaries one token crosses, as (from, to) device pairs. Stage order follows the
    layers: token embedding on the host, then layer 0..n-1, then the output; a layer whose routed
    experts stay in host memory sends its activation to the CPU and back."""
    out_dev = CPU if view.output_on_host else view.output_device
    order = [CPU] + [view.layer_device[layer.index] for layer in costs.layers if not layer.nextn] + [out_dev]
    pairs = [(prev, cur) for prev, cur in itertools.pairwise(order) if prev != cur]
    for layer in costs.layers:
        dev = view.layer_device[layer.index]
        if not layer.nextn and view.host_ffn(layer.index) and dev != CPU:
            pairs += [(dev, CPU), (CPU, dev)]
    return pairs


@dataclass(frozen=True)
class AttentionWork:
    """What a decoded token's attention works through: (query head, cached cell) pairs, the K and V values of
    those pairs (pairs x (d_k + d_v): a pair's dot product with its K row and its share of the V rows), and the
    cache bytes its query heads sweep (pairs x the layer's K and V bytes a cell: a cell's row holds every KV
    head's K and V side by side, and each query head walks the rows of all the cells)."""

    pairs: float = 0.0
    values: float = 0.0
    swept: float = 0.0

    def __add__(self, other: AttentionWork) -> AttentionWork:
        return AttentionWork(self.pairs + other.pairs, self.values + other.values, self.swept + other.swept)

    def __bool__(self) -> bool:
        return bool(self.pairs or self.values or self.swept)


NO_ATTENTION = AttentionWork()


def decode_attention(facts: ModelFacts, costs: CostTable, view: PlacementView) -> dict[str, AttentionWork]:
    """The attention one decoded token works through on each device: every query head of a layer scores every
    cell the layer reads (grouped heads share a KV row, not the work)."""
    work: dict[str, AttentionWork] = {}
    for layer in costs.layers:
        if not layer.nextn:
            dev = view.layer_device[layer.index]
            work[dev] = work.get(dev, NO_ATTENTION) + layer_attention(facts, layer, view)
    return work


def layer_attention(facts: ModelFacts, layer: LayerCost, view: PlacementView) -> AttentionWork:
    """One layer's share of decode_attention: its query heads times the cells it reads, their K and V values,
    and the cache rows those heads sweep (none for a layer without a KV cache)."""
    if not layer.kv_bytes_per_cell:
        return NO_ATTENTION
    lf = facts.layers[layer.index]
    pairs = lf.n_head * decode_cells(view, layer.window)
    return AttentionWork(pairs, pairs * (lf.head_dim_k + lf.head_dim_v), pairs * layer.kv_bytes_per_cell)


def decode_cells(view: PlacementView, window: int) -> int:
    """The KV cells one decoded token reads in a layer: the cache's fill, at most the window."""
    filled = view.n_ctx if view.n_past is None else view.n_past
    return min(filled, window) if window else filled


def predict(facts: ModelFacts, costs: CostTable, view: PlacementView, inventory: Inventory) -> Prediction:
    rates = Rates(inventory)
    per_device, kv_per_device = decode_bytes(facts, costs, view)
    pairs = boundaries(costs, view)
    act = facts.n_embd * ACTIVATION_BYTES_PER_VALUE
    boundary_s = sum(_boundary_seconds(rates, a, b, act) for a, b in pairs)
    attention = decode_attention(facts, costs, view)
    kernels = dict(view.kernels)
    seconds = {dev: n_bytes / rates.bandwidth(dev)
               + rates.attention_seconds(dev, kv_per_device.get(dev, 0), attention.get(dev, NO_ATTENTION))
               + (kernels.get(dev, 0) * rates.kernel_time(dev) if kernels.get(dev) else 0.0)
               for dev, n_bytes in per_device.items()}
    t_token = sum(seconds.values()) + boundary_s
    stages = tuple(StageTime(d, per_device[d] + kv_per_device.get(d, 0), seconds[d], kv_per_device.get(d, 0))
                   for d in per_device)
    prefill = _prefill_tokens_s(facts, costs, view, rates, pairs)
    return Prediction(decode_tokens_s=1.0 / t_token if t_token > 0 else 0.0, prefill_tokens_s=prefill,
                      stages=stages, n_boundaries=len(pairs), assumed_rates=rates.assumed,
                      rate_sources=rates.source_list)


def decode_bytes(facts: ModelFacts, costs: CostTable, view: PlacementView) -> tuple[dict[str, int], dict[str, int]]:
    """What one decoded token reads on each device: (weights and recurrent state, KV cache)."""
    frac = expert_fraction(facts.n_expert, facts.n_expert_used)
    weights: dict[str, int] = {}
    kv: dict[str, int] = {}
    for layer in costs.layers:
        if layer.nextn:
            continue  # MTP blocks are not run for plain decoding
        dev = view.layer_device[layer.index]
        dense, experts = layer_weight_bytes(layer, frac, view.n_seq)
        ffn = layer.group_bytes(WeightGroup.FFN) if layer.index in view.ffn_on_host and dev != CPU else 0
        on_host = (experts if layer.index in view.experts_on_host and dev != CPU else 0) + ffn
        weights[dev] = weights.get(dev, 0) + dense + experts - on_host
        kv[dev] = kv.get(dev, 0) + layer_kv_bytes(layer, decode_cells(view, layer.window))
        if on_host:
            weights[CPU] = weights.get(CPU, 0) + on_host
    out_dev = CPU if view.output_on_host else view.output_device
    weights[out_dev] = weights.get(out_dev, 0) + output_bytes(costs)
    return weights, kv


def output_bytes(costs: CostTable) -> int:
    """The output matrix (token_embd when tied) and the final norm, read once per token."""
    names = {OUTPUT, OUTPUT_NORM} | ({TOKEN_EMBD} if costs.tied_embeddings else set())
    return sum(t.n_bytes for t in costs.non_repeating if t.name in names)


def prefill_cells(view: PlacementView, window: int) -> float:
    """The KV cells a prompt's token attends to on average: half a full context, or (llama-bench -d)
    the cells already there plus half the ubatch; at most the window."""
    if view.n_past is None:
        return min(view.n_ctx, window or view.n_ctx) / 2
    cells = view.n_past + view.n_ubatch / 2
    return min(cells, window) if window else cells


@dataclass(frozen=True)
class PrefillWork:
    """What one ubatch of a prompt asks of each device before any rate applies."""

    flops: dict[str, float]         # matrix-product FLOPs per device (the prompt's last logits included)
    offload_bytes: float            # host weights op offload moves to `offload_to` (0 without it)
    offload_to: str | None
    boundary_bytes: int             # the ubatch's activations, copied at each split boundary
    attention: dict[str, float] = field(default_factory=dict)   # attention FLOPs, on the KV cache's device
    streamed: dict[str, float] = field(default_factory=dict)    # weight bytes each device reads for the ubatch


def prefill_work(facts: ModelFacts, costs: CostTable, view: PlacementView, first_offload_device: str | None
                 ) -> PrefillWork:
    batch = view.n_ubatch
    offload_to = first_offload_device if view.op_offload and batch >= op_offload_min_batch() else None
    frac = expert_fraction(facts.n_expert, facts.n_expert_used)
    selected = 1.0 - (1.0 - frac) ** batch if facts.n_expert else 0.0
    flops: dict[str, float] = {}
    attention: dict[str, float] = {}
    streamed: dict[str, float] = {}
    moved = 0.0

    def add(into: dict[str, float], dev: str, n: float) -> None:
        if n > 0:
            into[dev] = into.get(dev, 0.0) + n

    for layer in costs.layers:
        if layer.nextn:
            continue
        dev = view.layer_device[layer.index]
        lf = facts.layers[layer.index]
        elems = dict(layer.elements)
        expert_p, ffn_p = elems.get(WeightGroup.EXPERTS, 0), elems.get(WeightGroup.FFN, 0)
        expert_b, ffn_b = layer.group_bytes(WeightGroup.EXPERTS), layer.group_bytes(WeightGroup.FFN)
        used_p = sum(elems.values()) - expert_p + frac * expert_p      # parameters one token multiplies
        used_b = layer.weight_bytes - expert_b + selected * expert_b   # weight bytes the ubatch reads
        # QK^T and softmax(QK^T)·V, where the layer's KV cache is (op offload moves only weights' ops)
        add(attention, dev, 4 * batch * prefill_cells(view, lf.window) * lf.n_head * lf.head_dim_k)
        if dev == CPU:
            host_p, host_b = used_p, used_b
        else:   # routed experts or a dense FFN that -ot keeps in host memory
            on_e, on_f = layer.index in view.experts_on_host, layer.index in view.ffn_on_host
            host_p = (frac * expert_p if on_e else 0.0) + (ffn_p if on_f else 0.0)
            host_b = (selected * expert_b if on_e else 0.0) + (ffn_b if on_f else 0.0)
        add(flops, dev, 2 * batch * (used_p - host_p))
        add(streamed, dev, used_b - host_b)
        if offload_to is not None:
            moved += host_b                  # copied to the offload device, multiplied there
            add(flops, offload_to, 2 * batch * host_p)
        else:
            add(flops, CPU, 2 * batch * host_p)
            add(streamed, CPU, host_b)
    # Only the last token of a prompt needs logits: the whole output matrix is read for one row.
    out_dev = CPU if view.output_on_host else view.output_device
    add(flops, out_dev, 2 * facts.n_vocab * facts.n_embd)
    add(streamed, out_dev, output_bytes(costs))
    return PrefillWork(flops, moved, offload_to, batch * facts.n_embd * ACTIVATION_BYTES_PER_VALUE,
                       attention, streamed)


def _prefill_tokens_s(facts: ModelFacts, costs: CostTable, view: PlacementView, rates: Rates,
                      pairs: list[tuple[str, str]]) -> float:
    work = prefill_work(facts, costs, view, rates.first_device)
    busy: dict[str, float] = {}    # seconds each device spends on one ubatch

    def add(dev: str, seconds: float) -> None:
        busy[dev] = busy.get(dev, 0.0) + seconds

    for dev, n in work.flops.items():
        add(dev, n / rates.flops(dev))
    for dev, n in work.attention.items():
        add(dev, n / rates.attention_flops(dev))
    for dev, n in work.streamed.items():   # each ubatch reads its weights
        add(dev, n / rates.bandwidth(dev))
    if work.offload_to is not None and work.offload_bytes:
        add(work.offload_to, work.offload_bytes / rates.link(work.offload_to))   # the op-offload transfers
    # the boundary copies: the ubatch's activations cross every boundary (the sending side waits for it)
    for a, b in pairs:
        add(a, _boundary_seconds(rates, a, b, work.boundary_bytes))
    t_ubatch = sum(busy.values())
    if t_ubatch <= 0:
        return 0.0
    if not view.pipeline or view.n_ubatches == 1:
        return view.n_ubatch / t_ubatch
    # Pipeline parallelism: the scheduler keeps several copies of the graph's inputs and does not wait
    # between the ubatches of one llama_decode, so a device starts ubatch k+1 while the next works on k:
    # the first ubatch passes every stage, each further one adds the busiest device's time.
    u = view.n_ubatches
    return u * view.n_ubatch / (t_ubatch + (u - 1) * max(busy.values()))


def offloading(inventory: Inventory) -> bool:
    """Whether a device of the inventory takes host-weight ops (seed 000 1.off) at all."""
    return any(PROFILES[d.backend].offload_op for d in inventory.devices)


# A routed-expert tensor of a layer (`blk.N.ffn_up_exps.weight`, `..._chexps` for shared-expert
# layouts), as -ot rules move them (the same patterns as planner/emit/plan_report.py's).
LAYER_OF = re.compile(r"^blk\.(\d+)\.")
_EXPS = re.compile(r"_(ch|)exps\b")


def experts_on_host_of(est: Estimate) -> frozenset[int]:
    """The layers whose routed experts an estimate's -ot rules keep in host memory."""
    return frozenset(int(m.group(1)) for name, dev in est.moved
                     if dev == CPU and (m := LAYER_OF.match(name)) and _EXPS.search(name))


def ffn_on_host_of(est: Estimate) -> frozenset[int]:
    """The layers whose dense FFN weights an estimate's -ot rules keep in host memory (any of
    ffn_gate/up/down: the layer's FFN then runs on the CPU, its whole group counted there)."""
    return frozenset(int(m.group(1)) for name, dev in est.moved
                     if dev == CPU and (m := LAYER_OF.match(name))
                     and tensor_group(name[m.end():]) is WeightGroup.FFN)


def view_of_estimate(ctx: ModelContext, est: Estimate, experts_on_host: frozenset[int] = frozenset(),
                     output_on_host: bool = False, n_past: int | None = None) -> PlacementView:
    """The placement an estimate describes, as the throughput model sees it."""
    n = ctx.facts.n_layer_all
    layer_device = [CPU] * n
    for dev, layers in est.layers:
        for il in layers:
            if il < n:
                layer_device[il] = dev
    return PlacementView(tuple(layer_device), est.output_device, experts_on_host, est.cparams.n_ctx_seq,
                         est.cparams.n_ubatch, est.cparams.n_seq, output_on_host, est.flags.op_offload, n_past,
                         ffn_on_host_of(est), est.pipeline_parallel, min(est.flags.n_batch, est.cparams.n_ctx),
                         est.decode_kernels)


def predict_estimate(ctx: ModelContext, costs: CostTable, est: Estimate, inventory: Inventory,
                     experts_on_host: frozenset[int] = frozenset(), output_on_host: bool = False,
                     n_past: int | None = None) -> Prediction:
    """The throughput model's prediction for the placement an estimate describes."""
    view = view_of_estimate(ctx, est, experts_on_host, output_on_host, n_past)
    return predict(ctx.facts, costs, view, inventory)
