"""Execute a GGUF model under a placement: weights in their devices' buffers, KV caches per
layer on the layer's device, compute buffers from the allocator, splits from the scheduler.

The runner reads one `LlamaSettings` (planner/llama/settings.py: placement, cparams, cache types,
KV cells), the value `fitplan estimate` reads, so a validate run checks exactly what the estimate
predicted. Every device has a capacity (its budget);
running past it raises BufferAllocationError, which names the device and the shortfall.

Usage::

    runner = ModelRunner.load("model.gguf", parse_llama_flags(["-c", "1024"]), capacities={"RPC0": ...})
    runner = ModelRunner.from_settings(resolve_settings(ctx, flags, inventory))   # flags resolved already
    logits = runner.decode([1, 2, 3])          # [n_tokens, n_vocab]
    runner.reserve_report                      # splits and compute bytes of the reserve graphs
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import threadpoolctl
from gguf import MODEL_TENSOR, TENSOR_NAMES

from planner.core.errors import BadInput
from planner.gguf.tensor_data import TensorData
from planner.hardware.inventory import Backend as DeviceBackend
from planner.hardware.inventory import Inventory
from planner.llama.companions import target_n_rs_seq
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import LlamaFlags
from planner.llama.kv_dsv4 import dsv4_cells
from planner.llama.placement import CPU, CPU_REPACK, HOST, HOST_ROWS
from planner.llama.placement import Device as PlacedDevice
from planner.llama.settings import LlamaSettings, resolve_settings
from planner.model.arch import DSV4_CSA_RATIO, DSV4_HCA_RATIO, INDEXER_WIDTH, MSA_ARCHS, NO_MEMORY, AttnKind
from runtime.engine.afmoe import AFMOE, AfmoeBuilder
from runtime.engine.bert import BERT_ARCHS, MODERN_BERT, BertBuilder, ModernBertBuilder
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.cohere2moe import COHERE2MOE, Cohere2MoeBuilder
from runtime.engine.deepseek2 import HY_V4, MLA_ARCHS, MlaBuilder, MlaHParams, read_mla_hparams
from runtime.engine.deepseek4 import Deepseek4Builder
from runtime.engine.deepseek4_hparams import (
    DEEPSEEK4,
    Dsv4Cache,
    Dsv4HParams,
    dsv4_cache,
    loader_shapes,
    read_deepseek4_hparams,
)
from runtime.engine.dsa import mla_builder
from runtime.engine.falconh1 import FALCON_H1, FalconH1Builder
from runtime.engine.fused import FUSED_ARCHS, FusedBuilder
from runtime.engine.gemma3n import GEMMA3N, Gemma3nBuilder, read_gemma3n_hparams
from runtime.engine.gemma4 import GEMMA4, Gemma4Builder, Gemma4HParams, read_gemma4_hparams
from runtime.engine.gemma_embedding import GEMMA_EMBEDDING, GemmaEmbeddingBuilder
from runtime.engine.glm5next import GLM5_NEXT, Glm5NextBuilder, read_glm5next_hparams
from runtime.engine.granitehybrid import GRANITE_HYBRID, GraniteHybridBuilder
from runtime.engine.hparams import HParams, read_hparams
from runtime.engine.hy_v4 import HyV4Builder
from runtime.engine.jamba import JAMBA, JambaBuilder
from runtime.engine.kimi import (
    BAILINGMOE3,
    KDA_ARCHS,
    KIMI_K3,
    KIMI_LINEAR,
    BailingMoe3Builder,
    KimiLinearBuilder,
    read_kimi_hparams,
)
from runtime.engine.kimi_k3 import KimiK3Builder
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.lfm2 import LFM2, LFM2MOE, Lfm2Builder
from runtime.engine.llama4 import LLAMA4, Llama4Builder
from runtime.engine.lora import Adapters, load_adapters
from runtime.engine.mamba import MAMBA, MAMBA2, MambaBuilder
from runtime.engine.meta_runner import ReduceCount, TimedMetaBackend, make_meta_backend
from runtime.engine.mhc import HC_FUSED
from runtime.engine.mimo2 import MIMO2, Mimo2Builder
from runtime.engine.msa import index_cache, msa_builder, read_msa
from runtime.engine.nemotronh import NEMOTRON_H, NEMOTRON_H_MOE, NemotronHBuilder
from runtime.engine.phimoe import PHIMOE, PhimoeBuilder
from runtime.engine.qwen3next import QWEN3NEXT, Qwen3NextBuilder
from runtime.engine.qwen35 import QWEN35, QWEN35MOE, Qwen35Builder
from runtime.engine.recurrent import RecurrentStates
from runtime.engine.step35 import STEP35, Step35Builder
from runtime.ggml.backend import (
    UNLIMITED,
    Backend,
    Device,
    DeviceType,
    alloc_tensors,
    make_cpu,
)
from runtime.ggml.compute import Measurement
from runtime.ggml.exact_matmul import REPACKED
from runtime.ggml.graph import BufferUsage, GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS, prefetch_f32
from runtime.ggml.mapped import map_weights
from runtime.ggml.sched import Scheduler
from runtime.ggml.sched_errors import BufferAllocationError
from runtime.ggml.vulkan_ops import vulkan_supports

log = logging.getLogger(__name__)

# KV cache types decode executes (runtime/engine/kvcache.py); the reserve sizes every -ctk/-ctv type.
KV_CACHE_TYPES = frozenset({GGMLType.F16, GGMLType.F32})


def _exact_kernels():
    from runtime.ggml.exact import EXACT_KERNELS  # imported on request: only validation needs it

    return EXACT_KERNELS


# Kernel tables by name: "default" computes in float32 with BLAS; "ggml-avx2" reproduces
# ggml-cpu's x86-64-v3 build bit for bit (runtime/ggml/exact.py) at a fraction of the speed.
KERNEL_SETS = {"default": lambda: KERNELS, "ggml-avx2": _exact_kernels}
GRAPH_CACHE = 4   # graphs kept for reuse (llama.cpp reuses a graph while its shape holds)
PIN_MAX_TOKENS = 32   # llama-context.cpp graph_get_cb pins "norm" below this batch size


def limit_blas_threads(n: int = 1) -> bool:
    """Run numpy's BLAS on n threads (threadpoolctl); False when numpy links no BLAS it can steer.

    A decode step is hundreds of small matrix-vector products: with a second BLAS thread each
    one waits for a core, and on a shared 2-core machine that made a Gemma 3 270M token 4x
    slower (bench/bench_runtime_speed.py), for a gain only on the output matrix. The large
    products use the other cores through runtime/ggml/threads.py instead (row blocks, one
    single-threaded BLAS call each).
    """
    # Not used as a context manager: the limit holds for the rest of the process.
    threadpoolctl.threadpool_limits(limits=n, user_api="blas")
    return any(lib["user_api"] == "blas" for lib in threadpoolctl.threadpool_info())


class TimedBackend(Backend):
    """A backend that records how long each split took (validate's time per split)."""

    def __init__(self, device: Device) -> None:
        super().__init__(device)
        self.split_seconds: list[float] = []

    def compute(self, nodes: Sequence[Tensor]) -> None:
        t0 = time.perf_counter()
        super().compute(nodes)
        self.split_seconds.append(time.perf_counter() - t0)


@dataclass(frozen=True)
class ReserveReport:
    """What llama.cpp's sched_reserve reports: splits and nodes of the prompt (pp) and one-token
    (tg) graphs, and the compute buffer per device after both were reserved."""

    n_splits_pp: int
    n_splits_tg: int
    n_nodes_pp: int
    n_nodes_tg: int
    compute_bytes: Mapping[str, int]
    tg_kernels: Mapping[str, int] = field(default_factory=dict)   # per backend, the one-token graph's op nodes


@dataclass
class StepRecord:
    n_tokens: int
    measurement: Measurement
    seconds: float
    split_seconds: dict[str, float] = field(default_factory=dict)
    reduces: ReduceCount | None = None   # -sm tensor: the meta backend's AllReduces in this step


def _device(dev: PlacedDevice, capacity: int) -> Device:
    """The runtime's device for a placed one: its profile's alignment, padding, offload and size limit."""
    profile = dev.profile
    return Device(dev.name, DeviceType.GPU, capacity, alignment=dev.alignment,
                  offload_min_batch=profile.offload_min_batch(), profile=profile,
                  compute_capability=dev.compute_capability,
                  supports=vulkan_supports(dev.max_tensor_bytes, dev.vk_subgroup_size)
                  if dev.backend is DeviceBackend.VULKAN else None)


def _device_row(row: str) -> str:
    """The runtime's device for a breakdown row: repacked host weights live in the CPU's memory too."""
    return CPU if row in HOST_ROWS else row


# the architectures of the hand-written hybrid builders (each dispatched in ModelRunner._builder)
# builders of the architectures with recurrent state (model, hparams, weights, KV cache, states)
STATE_BUILDERS: dict[str, Callable[..., DecoderBuilder | MlaBuilder]] = {
    LFM2: Lfm2Builder, LFM2MOE: Lfm2Builder, JAMBA: JambaBuilder, FALCON_H1: FalconH1Builder,
    MAMBA: MambaBuilder, MAMBA2: MambaBuilder, NEMOTRON_H: NemotronHBuilder, NEMOTRON_H_MOE: NemotronHBuilder,
    QWEN35: Qwen35Builder, QWEN35MOE: Qwen35Builder, QWEN3NEXT: Qwen3NextBuilder, GRANITE_HYBRID: GraniteHybridBuilder,
    KIMI_LINEAR: KimiLinearBuilder, BAILINGMOE3: BailingMoe3Builder, KIMI_K3: KimiK3Builder,   # linear: KDA + MLA
    GLM5_NEXT: Glm5NextBuilder,   # glm5n: KDA + MLA with the k-pool indexer, hyper-connections
}
# glm5n: state builders that take the indexer cache and the fused ops turned off after the states
INDEXED_STATE_BUILDERS = frozenset({GLM5_NEXT})
# glm5n, dsv4: builders that emit the fused hyper-connection ops (llama-context.cpp resolve_fused_ops probes them)
FUSED_HC_ARCHS = frozenset({GLM5_NEXT, DEEPSEEK4})
# mtp: the builders that write the rollback snapshots a drafter asks for (delta-net-base.cpp, n_rs_seq > 0)
ROLLBACK_BUILDERS = frozenset({QWEN35, QWEN35MOE})
# hand-written builders of (hparams, weights, KV cache)
PLAIN_BUILDERS: dict[str, Callable[..., DecoderBuilder]] = {
    GEMMA4: Gemma4Builder, GEMMA3N: Gemma3nBuilder, GEMMA_EMBEDDING: GemmaEmbeddingBuilder,
    AFMOE: AfmoeBuilder, PHIMOE: PhimoeBuilder, STEP35: Step35Builder, MIMO2: Mimo2Builder,
}
# the meta backend executes llama-shaped layers only (tensor_split.py)
HAND_BUILT = frozenset(STATE_BUILDERS) | frozenset(PLAIN_BUILDERS) | {LLAMA4} | FUSED_ARCHS | MSA_ARCHS | {DEEPSEEK4}


class ModelRunner:
    """One model loaded under one set of resolved flags; decode() runs token ids through it."""

    def __init__(self, settings: LlamaSettings, capacities: Mapping[str, int], n_outputs_max: int | None = None,
                 kernels: str = "default") -> None:
        self.settings = settings
        ctx, placement, cp = settings.ctx, settings.placement, settings.cparams
        self.ctx, self.flags, self.placement, self.cp = ctx, settings.flags, placement, cp
        # llama.cpp reserves min(n_ubatch, n_outputs_max) outputs; n_outputs_max is n_batch by
        # default (common.h), llama-server and llama-cli set it to the number of sequences.
        self.n_outputs_max = n_outputs_max or cp.n_batch
        self.hp: HParams | MlaHParams | Dsv4HParams = (
                                         read_mla_hparams(ctx.model, ctx.facts) if ctx.model.architecture in MLA_ARCHS
                                         else read_deepseek4_hparams(ctx.model, ctx.facts)
                                         if ctx.model.architecture == DEEPSEEK4
                                         else read_kimi_hparams(ctx.model, ctx.facts)
                                         if ctx.model.architecture in KDA_ARCHS
                                         else read_glm5next_hparams(ctx.model, ctx.facts)   # glm5n
                                         if ctx.model.architecture == GLM5_NEXT
                                         else read_gemma4_hparams(ctx.model, ctx.facts)
                                         if ctx.model.architecture == GEMMA4
                                         else read_gemma3n_hparams(ctx.model, ctx.facts)
                                         if ctx.model.architecture == GEMMA3N
                                         else read_hparams(ctx.model, ctx.facts))
        limit_blas_threads(1)
        self.cpu = TimedBackend(make_cpu(capacities.get(CPU, capacities.get(HOST, UNLIMITED))).device)
        self.weights: dict[str, Tensor] = {}
        self.backends: dict[str, TimedBackend | TimedMetaBackend] = {}
        for dev in placement.devices:
            self.backends[dev.name] = (self._meta_backend(dev, capacities) if dev.members and self._splits_tensors()
                                       else TimedBackend(_device(dev, capacities.get(dev.name, UNLIMITED))))
        self.backends["CPU"] = self.cpu
        order = [self.backends[d.name] for d in placement.devices] + [self.cpu]
        self.sched = Scheduler(order, parallel=placement.pipeline_parallel, op_offload=settings.flags.op_offload)
        self.pipeline_parallel = placement.pipeline_parallel   # False after llama.cpp's retry without it
        if kernels not in KERNEL_SETS:
            raise BadInput(f"kernels {kernels!r}: expected one of {', '.join(KERNEL_SETS)}")
        self.kernels = kernels
        for b in self.all_backends():
            b.kernels = KERNEL_SETS[kernels]()
        self.weight_bytes: dict[str, int] = {}   # device -> bytes of its weight buffers
        self.adapters = Adapters()                # applied LoRA adapters (runtime/engine/lora.py)
        self.lora_bytes: dict[str, int] = {}     # device -> bytes of its LoRA buffers
        self.kv_bytes: dict[str, int] = {}
        self.kv: KVCache | None = None
        self.index_cache: list[Tensor | None] = []   # mla: a DSA model's indexer key cache per layer
        self.msa_cache: list[tuple[Tensor, Tensor] | None] = []   # glm5: minimax-m3's indexer cache (K, V)
        self.dsv4_cache: Dsv4Cache | None = None   # dsv4: deepseek4's compressed caches and compressor states
        self.unfused: set[Op] = set()   # glm5n: fused hyper-connection ops resolve_fused_ops turned off
        # recurrent layers' r and s (none for most models), with a drafter's rollback rows (need_n_rs_seq)
        self.states = RecurrentStates(ctx.facts, cp.n_seq, target_n_rs_seq(ctx.facts.arch, settings.flags))
        self._graphs: OrderedDict[BatchShape, BuiltGraph] = OrderedDict()
        self.steps: list[StepRecord] = []
        self.reserve_report: ReserveReport | None = None
        self.n_past = 0

    def _splits_tensors(self) -> bool:
        """Whether the meta backend can execute this model: llama-shaped layers only (tensor_split.py).
        Other architectures keep one plain device of the Meta() row: it sizes them the same (the meta
        buffer holds full tensors), and decode refuses them."""
        return isinstance(self.hp, HParams) and self.hp.arch not in HAND_BUILT

    def _meta_backend(self, dev: PlacedDevice, capacities: Mapping[str, int]) -> TimedMetaBackend:
        """-sm tensor: the Meta() device of the placement's members; its budget is its row's, or the
        members' summed where only they have one (see runtime/engine/meta_runner.py)."""
        assert isinstance(self.hp, HParams)
        members = [TimedBackend(_device(m, UNLIMITED)) for m in dev.members]
        budgets = [capacities[m.name] for m in dev.members if m.name in capacities]
        capacity = capacities.get(dev.name, sum(budgets) if len(budgets) == len(members) else UNLIMITED)
        return make_meta_backend(dev.name, members, capacity, dev.profile, dev.compute_capability, self.hp,
                                 self.weights, self.flags.tensor_split)

    def all_backends(self) -> list[Backend]:
        """Every backend that computes: the scheduler's and a meta backend's members."""
        out: list[Backend] = []
        for b in self.backends.values():
            out += [b, *b.device.members] if isinstance(b, TimedMetaBackend) else [b]
        return out

    # --- loading ----------------------------------------------------------------------------
    @classmethod
    def load(cls, model: str | ModelContext, flags: LlamaFlags, inventory: Inventory | None = None,
             capacities: Mapping[str, int] | None = None, reserve: bool = True,
             n_outputs_max: int | None = None, weights: bool = True, kernels: str = "default") -> ModelRunner:
        """Resolve the flags (planner.llama.settings), then `from_settings`."""
        return cls.from_settings(resolve_settings(model_context(model), flags, inventory), capacities, reserve,
                                 n_outputs_max, weights, kernels)

    @classmethod
    def from_settings(cls, settings: LlamaSettings, capacities: Mapping[str, int] | None = None, reserve: bool = True,
                      n_outputs_max: int | None = None, weights: bool = True, kernels: str = "default",
                      dry_run: bool = True) -> ModelRunner:
        """Load (weights=False: sizes only, no tensor data read), allocate the KV cache and reserve
        the compute buffers (dry_run: as llama-fit-params sizes them; False: as a real load does)."""
        runner = cls(settings, capacities or {}, n_outputs_max, kernels)
        runner.load_weights(copy_data=weights)
        runner.alloc_kv()
        if reserve:
            runner.reserve(dry_run)
        return runner

    def load_weights(self, copy_data: bool = True) -> None:
        """One weights buffer per device (ggml_backend_alloc_ctx_tensors_from_buft), its sizes counted
        against the device; the tensors then read their bytes from a read-only map of the file, in
        their GGUF types (copy_data False: sizing only, nothing mapped; issue #22: the buffers'
        own bytes are never touched, so they cost nothing)."""
        infos = {t.name: t for t in self.ctx.model.tensors}
        source = {s.name: (s.duplicate_of or s.name) for s in self.ctx.slots}
        by_device: dict[str, list[Tensor]] = {}
        for name, row in self.placement.tensor_buft:
            info = infos[source[name]]
            t = Tensor(info.ggml_type, info.shape, name=name)
            if row == CPU_REPACK and self.kernels == "ggml-avx2":
                REPACKED.add(t)   # llama.cpp runs its interleaved kernels on these
            by_device.setdefault(_device_row(row), []).append(t)
            self.weights[name] = t
        for dev, tensors in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.WEIGHTS)
            self.weight_bytes[dev] = sum(b.size for b in buffers)
        if isinstance(self.hp, Dsv4HParams):   # dsv4: the loader's 3-D attn_output_a
            loader_shapes(self.weights, self.hp)
        if copy_data:
            map_weights(self.weights, source, TensorData(self.ctx.model))
        for alias, placed in self.placement.aliases:   # a layer's rope_freqs copy shared with an earlier layer
            self.weights[alias] = self.weights[placed]
        self._load_adapters(copy_data)

    def _load_adapters(self, copy_data: bool) -> None:
        """The applied adapters' tensors, one buffer per device apart from the model's
        (llama_adapter_lora_init_impl allocates its own, by the patched weight's buffer type). Their
        usage stays ANY: only llama-model.cpp marks its buffers WEIGHTS, so the scheduler does not place
        an adapter's matmul by A or B (ggml-backend.cpp 1.wgt / 1.off) but copies them where it runs."""
        self.adapters, tensors = load_adapters(self.settings, self.weights)
        by_device: dict[str, list[Tensor]] = {}
        for at in tensors:
            by_device.setdefault(_device_row(at.row), []).append(at.tensor)
        for dev, group in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, group, BufferUsage.ANY)
            self.lora_bytes[dev] = sum(b.size for b in buffers)
        if copy_data:
            files = {id(at.adapter): TensorData(at.adapter) for at in tensors}
            for at in tensors:
                at.tensor.raw_bytes()[:] = files[id(at.adapter)].raw(at.info.name, at.tensor.nbytes())

    def alloc_kv(self) -> None:
        """K and V caches of -ctk/-ctv's types, one stream per sequence unless unified (cells per stream)."""
        hp, cp, settings = self.hp, self.cp, self.settings
        sizes = {CacheKind.BASE: cp.n_ctx_seq,
                 CacheKind.SWA: settings.kv_cells.get(AttnKind.SWA, 0) if any(hp.swa) else 0}
        dsv4 = isinstance(hp, Dsv4HParams)   # the raw window cache: per sequence whatever -kvu says
        if dsv4:
            sizes[CacheKind.SWA] = dsv4_cells(settings, 0)
        # llama.cpp makes its caches while -fa auto still counts as on and resolves it afterwards
        # (llama-context.cpp resolve_fused_ops): a cache of an auto flash attention turned off keeps V
        # untransposed (attn_v_trans = !flash_attn at creation)
        self.auto_fa_off = self.flags.flash_attn == "auto" and not cp.flash_attn
        # an MLA cache holds K; V is a view of it (llama-kv-cache.cpp has_v); deepseek4's raw cache likewise
        k_only = isinstance(hp, MlaHParams | Dsv4HParams)
        # moe26: V heads of their own width (mimo2)
        head_dim_v = hp.head_dim_v if isinstance(hp, HParams) else 0
        v_widths = [hp.n_embd_v_gqa(il) for il in range(hp.n_layer)] if isinstance(hp, HParams) and head_dim_v \
            else None
        self.kv = KVCache([hp.n_embd_gqa(il) for il in range(hp.n_layer)], list(hp.swa), sizes, hp.n_swa,
                          v_trans=not cp.flash_attn and not k_only and not self.auto_fa_off, type_k=settings.type_k,
                          type_v=settings.type_v, n_stream=cp.n_seq if dsv4 else cp.n_stream, head_dim=hp.head_dim,
                          n_embd_v_gqa=v_widths, head_dim_v=head_dim_v)
        if hp.arch in NO_MEMORY:   # create_memory makes none: the layers attend over the ubatch itself
            return
        by_device: dict[str, list[Tensor]] = {}
        for il in range(hp.n_layer):
            dev = self.placement.layer_device[il] if self.flags.kv_offload else "CPU"
            kv = [self.kv.k[il]] if k_only else [self.kv.k[il], self.kv.v[il]]
            # a block's cache, then its recurrent states (both for falcon-h1's, one or the other elsewhere)
            by_device.setdefault(dev, []).extend((kv if hp.n_embd_gqa(il) else []) + self.states.tensors(il))
        for dev, tensors in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.ANY)
            self.kv_bytes[dev] = sum(b.size for b in buffers)
        self._alloc_index_cache()
        self._alloc_msa_cache()
        self._alloc_dsv4_cache()

    def _alloc_dsv4_cache(self) -> None:
        """dsv4: llama_kv_cache_dsv4's compressed caches, indexer cache and compressor states, on each layer's
        device (its own buffers; one stream per sequence)."""
        hp = self.hp
        if not isinstance(hp, Dsv4HParams):
            return
        cells = {r: dsv4_cells(self.settings, r) for r in (DSV4_CSA_RATIO, DSV4_HCA_RATIO)}
        self.dsv4_cache = dsv4_cache(hp, self.settings.type_k, cells, self.cp.n_seq)
        by_device: dict[str, list[Tensor]] = {}
        for il in range(hp.n_layer):
            dev = self.placement.layer_device[il] if self.flags.kv_offload else "CPU"
            by_device.setdefault(dev, []).extend(self.dsv4_cache.tensors(il))
        for dev, tensors in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.ANY)
            self.kv_bytes[dev] = self.kv_bytes.get(dev, 0) + sum(b.size for b in buffers)

    def _alloc_index_cache(self) -> None:
        """mla: a DSA model's second cache, the lightning indexer's keys of the layers that own one
        (llama_kv_cache_dsa: its own buffers, the MLA cache's cells and streams, type_k, K only)."""
        hp = self.hp
        if not isinstance(hp, MlaHParams) or not hp.dsa:
            return
        cells, ns = self.cp.n_ctx_seq, self.cp.n_stream
        width = hp.index_head * INDEXER_WIDTH.get(hp.arch, 1)   # glm5n: glm5-next's key | gate | pooled rows
        self.index_cache = [Tensor(self.settings.type_k, (width, cells, ns), name=f"cache_lid_k_l{il}")
                            if own else None for il, own in enumerate(hp.index_full)]
        by_device: dict[str, list[Tensor]] = {}
        for il, t in enumerate(self.index_cache):
            if t is not None:
                by_device.setdefault(self.placement.layer_device[il] if self.flags.kv_offload else "CPU", []).append(t)
        for dev, tensors in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.ANY)
            self.kv_bytes[dev] = self.kv_bytes.get(dev, 0) + sum(b.size for b in buffers)

    def _alloc_msa_cache(self) -> None:
        """glm5: minimax-m3's indexer cache (llama_kv_cache_msa's second llama_kv_cache: its own buffers, the
        same cells and streams, K and V) for the blocks past the leading dense ones."""
        hp = self.hp
        if hp.arch not in MSA_ARCHS or not isinstance(hp, HParams):
            return
        self.msa_cache = index_cache(read_msa(self.ctx.model), hp, self.settings.type_k, self.settings.type_v,
                                     self.cp.n_ctx_seq, self.cp.n_stream)
        by_device: dict[str, list[Tensor]] = {}
        for il, kv in enumerate(self.msa_cache):
            if kv is not None:
                by_device.setdefault(self.placement.layer_device[il] if self.flags.kv_offload else "CPU", []).extend(kv)
        for dev, tensors in by_device.items():
            buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.ANY)
            self.kv_bytes[dev] = self.kv_bytes.get(dev, 0) + sum(b.size for b in buffers)

    # --- graphs -------------------------------------------------------------------------------
    def _hyper_connected_builder(self) -> HyV4Builder | Deepseek4Builder | None:
        """dsv4: the builders of the hyper-connected families (hy_v4, deepseek4), None for other models."""
        assert self.kv is not None
        fa, offload = self.cp.flash_attn, self.flags.kv_offload
        if isinstance(self.hp, MlaHParams) and self.hp.arch == HY_V4:
            return HyV4Builder(self.hp, self.weights, self.kv, self.index_cache, flash_attn=fa, offload_kqv=offload)
        if isinstance(self.hp, Dsv4HParams):
            assert self.dsv4_cache is not None
            return Deepseek4Builder(self.hp, self.weights, self.kv, self.dsv4_cache, self.unfused, flash_attn=fa,
                                    offload_kqv=offload)
        return None

    def _builder(self) -> DecoderBuilder | MlaBuilder | Deepseek4Builder:
        """The architecture's graph builder: MLA/DSA, a hand-written module's (STATE_BUILDERS, llama4, the
        fused block's) or the llama-shaped one."""
        assert self.kv is not None
        fa, offload = self.cp.flash_attn, self.flags.kv_offload
        hyper = self._hyper_connected_builder()
        if hyper is not None:
            return hyper
        assert not isinstance(self.hp, Dsv4HParams)
        with_states = STATE_BUILDERS.get(self.hp.arch)
        if with_states is not None:
            # glm5n: glm5-next's builder also reads the k-pool indexer's cache
            index = (self.index_cache, self.unfused) if self.hp.arch in INDEXED_STATE_BUILDERS else ()
            return with_states(self.ctx.model, self.hp, self.weights, self.kv, self.states, *index, flash_attn=fa,
                               offload_kqv=offload)
        if self.hp.arch in MSA_ARCHS and isinstance(self.hp, HParams):   # glm5
            return msa_builder(self.ctx.model, self.hp, self.weights, self.kv, self.msa_cache, n_seq=self.cp.n_seq,
                               flash_attn=fa, offload_kqv=offload)
        if isinstance(self.hp, MlaHParams):
            return mla_builder(self.hp, self.weights, self.kv, self.index_cache, flash_attn=fa, offload_kqv=offload)
        if self.hp.arch == LLAMA4:
            return Llama4Builder(self.ctx.model, self.hp, self.weights, self.kv, flash_attn=fa, offload_kqv=offload)
        plain = PLAIN_BUILDERS.get(self.hp.arch)
        if plain is not None:
            return plain(self.hp, self.weights, self.kv, flash_attn=fa, offload_kqv=offload)
        if self.hp.arch in BERT_ARCHS:
            encoder = ModernBertBuilder if self.hp.arch == MODERN_BERT else BertBuilder
            return encoder(self.ctx.model, self.hp, self.weights, self.kv, flash_attn=fa, offload_kqv=offload,
                           n_ctx_seq=self.cp.n_ctx_seq)
        if self.hp.arch == COHERE2MOE:
            return Cohere2MoeBuilder(self.ctx.model, self.hp, self.weights, self.kv, flash_attn=fa,
                                     offload_kqv=offload, n_ctx_seq=self.cp.n_ctx_seq)
        if self.hp.arch in FUSED_ARCHS:
            return FusedBuilder(self.ctx.model, self.hp, self.weights, self.kv, flash_attn=fa, offload_kqv=offload,
                                n_ctx_seq=self.cp.n_ctx_seq)
        return DecoderBuilder(self.hp, self.weights, self.kv, flash_attn=fa, offload_kqv=offload)

    def _check_rollback(self) -> None:
        """mtp: BadInput where the target keeps a drafter's rollback rows and its builder does not write them."""
        if self.states and self.states.n_rs_seq and self.hp.arch not in ROLLBACK_BUILDERS:
            raise BadInput(f"the runtime's {self.hp.arch} graph has no recurrent rollback rows (n_rs_seq "
                           f"{self.states.n_rs_seq}, a drafter's): its compute is the formula's")

    def _graph(self, shape: BatchShape) -> BuiltGraph:
        built = self._graphs.get(shape)
        if built is not None:
            self._graphs.move_to_end(shape)
            return built
        self._check_rollback()
        builder = self._builder()
        builder.lora = self.adapters   # applied where llama.cpp's builders apply them (runtime/engine/lora.py)
        built = builder.build(shape)
        full_offload = self.flags.n_gpu_layers < 0 or self.flags.n_gpu_layers > self.ctx.facts.n_layer_all
        if shape.n_tokens < PIN_MAX_TOKENS or full_offload:
            for t, il in built.norm_pins:
                self.sched.set_tensor_backend(t, self.backends[self.placement.layer_device[il]])
        for t in built.cpu_pins:
            self.sched.set_tensor_backend(t, self.cpu)
        self._graphs[shape] = built
        if len(self._graphs) > GRAPH_CACHE:
            _, old = self._graphs.popitem(last=False)
            for t, _il in old.norm_pins:
                self.sched.pins.pop(t, None)
            for t in old.cpu_pins:
                self.sched.pins.pop(t, None)
        return built

    def _resolve_fused_ops(self) -> None:
        """glm5n: llama-context.cpp resolve_fused_ops for the fused hyper-connection ops (HC_FUSED, in its
        order): the one-token graph of each probe is split (split_only, the norm pins held), and an op whose
        fused node of some layer runs on another device than the layer's (model.dev_layer: a layer-boundary
        node pulled to the next device) is turned off for every layer, the probes after it built without it."""
        assert self.kv is not None
        if self.hp.arch not in FUSED_HC_ARCHS:
            return
        n = self.cp.n_seq
        full = tuple((k, self.kv.tables[k].size) for k in self.kv.kind_order())
        for op in HC_FUSED:
            built = self._graph(BatchShape(n, n, full))
            nodes = [(t, il) for o, t, il in built.fused if o is op]
            if not nodes:
                continue
            self.sched.split_graph(built.graph)
            if any(self.sched.get_tensor_backend(t) is not self.backends[self.placement.layer_device[il]]
                   for t, il in nodes):
                self.unfused.add(op)
                self._forget_graphs()
        self.sched.reset()

    def _forget_graphs(self) -> None:
        for built in self._graphs.values():
            for t, _il in built.norm_pins:
                self.sched.pins.pop(t, None)
            for t in built.cpu_pins:
                self.sched.pins.pop(t, None)
        self._graphs.clear()

    def reserve(self, dry_run: bool = True) -> ReserveReport:
        """llama.cpp's sched_reserve: the worst-case prompt graph, the one-token graph, the prompt again.
        `dry_run`: llama-fit-params' (and -fit's fitting passes') no-alloc reserve; False for what a real
        load (llama-server, llama-cli) allocates.

        With -np N the prompt ubatch is min(n_ctx, n_ubatch) tokens rounded up to a multiple of N
        (its outputs counted before rounding) and the token graph is N tokens with N outputs, one
        per sequence (llama-context.cpp sched_reserve, graph_reserve)."""
        assert self.kv is not None
        self._resolve_fused_ops()
        n_seqs = self.cp.n_seq
        n_tokens = min(self.cp.n_ctx, self.cp.n_ubatch)
        n_outputs = min(n_tokens, self.n_outputs_max)
        n_tokens = -(-n_tokens // n_seqs) * n_seqs
        full = tuple((k, self.kv.tables[k].size) for k in self.kv.kind_order())
        pp = self._graph(BatchShape(n_tokens, n_outputs, full))
        tg = self._graph(BatchShape(n_seqs, n_seqs, full))
        # A dry run's first prompt reserve splits as if the layer-norm pins were absent (the norm
        # opening a device's first layer stays on the previous device and crosses as an extra input),
        # its split count is the prompt figure llama.cpp logs, and the buffers keep that reserve's size:
        # ggml_backend_sched_reserve_size (ggml-backend.cpp; the no_alloc path of llama-context.cpp
        # sched_reserve -> graph_reserve) resets the scheduler before splitting, which forgets the pins
        # graph_get_cb set while the graph was built. A real load's ggml_backend_sched_reserve does not
        # reset first: its pins hold (measured, llama-server -ngl 99 over two rpc-servers: the last
        # device holds four pipeline copies of one [n_embd, n_ubatch] f32 input fewer than the dry run).
        pinned = ({t: self.sched.pins.pop(t) for t, _il in pp.norm_pins if t in self.sched.pins}
                  if dry_run else {})
        try:
            self.sched.reserve(pp.graph)
        except BufferAllocationError:
            if self.sched.n_copies == 1:
                raise
            # llama-context.cpp sched_reserve: "compute buffer allocation failed, retrying without
            # pipeline parallelism" — a new scheduler with one copy of every input
            log.warning("compute buffer allocation failed, retrying without pipeline parallelism")
            old = self.sched
            old.reset()      # the failed reserve left the graph's sources on its input copies
            old.release()
            self.sched = Scheduler(old.backends, parallel=False, op_offload=old.ctx.op_offload)
            self.sched.pins.update(old.pins)
            self.pipeline_parallel = False
            self.sched.reserve(pp.graph)
        n_pp = self.sched.n_splits
        # a dry run's sizes are this first prompt reserve's: llama-context.cpp sched_reserve passes its size
        # array to that graph_reserve alone; the token and second prompt reserves only split (split_only = no_alloc)
        first = self.compute_bytes()
        self.sched.pins.update(pinned)
        self.sched.reserve(tg.graph)
        n_tg = self.sched.n_splits
        tg_kernels = self.sched.kernel_nodes()
        self.sched.reserve(pp.graph)
        # pairs on a weight no graph applies them to: llama.cpp loads them but its graph does not use them
        # either where it multiplies without build_lora_mm (deepseek2's attention projections and lm_head)
        if self.adapters.unreached():
            log.warning("LoRA pairs on %s are not in the runtime's graph (llama.cpp applies none where it "
                        "multiplies without build_lora_mm)",
                        ", ".join(self.adapters.unreached()))
        self.reserve_report = ReserveReport(n_pp, n_tg, len(pp.graph.nodes), len(tg.graph.nodes),
                                            first if dry_run else self.compute_bytes(), tg_kernels)
        return self.reserve_report

    # --- running ------------------------------------------------------------------------------
    def _inputs(self, built: BuiltGraph, tokens: np.ndarray, positions: np.ndarray,
                cells: dict[CacheKind, np.ndarray], out_rows: np.ndarray) -> dict[Tensor, np.ndarray]:
        assert self.kv is not None
        inputs: dict[Tensor, np.ndarray] = {built.tokens: tokens.astype(np.int32),
                                             built.pos: positions.astype(np.int32),
                                             built.out_ids: out_rows.astype(np.int32)}
        for kind, n_kv in built.shape.n_kv:
            inp, table = built.attn[kind], self.kv.tables[kind]
            c = cells[kind]
            inputs[inp.k_idxs] = c
            if self.kv.v_trans:
                width = self.kv.v[0].ne[0]
                inputs[inp.v_idxs] = (np.arange(width)[None, :] * table.size + c[:, None]).reshape(-1)
            else:
                inputs[inp.v_idxs] = c
            inputs[inp.mask] = table.mask(positions, n_kv)
        return inputs

    def _check_executable(self) -> None:
        """decode runs one sequence over f16/f32 caches; other settings are only sized (reserve)."""
        assert self.kv is not None
        if isinstance(self.hp, MlaHParams) and self.hp.missing_kernel:
            raise BadInput(f"{self.hp.arch}: the runtime has no kernel for {self.hp.missing_kernel}; it only sizes "
                           f"this model (validate --reserve-only)")
        if self.hp.arch == LLAMA4:
            raise BadInput(f"{self.hp.arch}: the runtime sizes llama4's graphs but does not run them (no "
                           f"temperature-tuning input; validate --reserve-only)")
        if isinstance(self.hp, MlaHParams) and self.hp.dsa:
            raise BadInput(f"{self.hp.arch}: the runtime sizes the DSA indexer's graphs but does not run them "
                           f"(validate --reserve-only)")
        if isinstance(self.hp, Dsv4HParams):
            raise BadInput(f"{self.hp.arch}: the runtime sizes deepseek4's graphs but does not run them "
                           f"(validate --reserve-only)")
        if self.states:
            raise BadInput(f"{self.hp.arch}: the runtime sizes the graphs of recurrent layers but does not run them "
                           f"(validate --reserve-only)")
        # the encoders' inputs (an [n_tokens, n_tokens] mask without a cache, token types) are not filled
        if isinstance(self.hp, Gemma4HParams) or self.hp.arch in (GEMMA_EMBEDDING, *MSA_ARCHS, *BERT_ARCHS):
            raise BadInput(f"{self.hp.arch}: the runtime sizes its graphs but does not run them "
                           f"(validate --reserve-only)")
        if self.flags.split_mode == "tensor" and not self._splits_tensors():
            raise BadInput(f"-sm tensor: the runtime's meta backend splits llama-shaped models only, not "
                           f"{self.hp.arch}; it only sizes this one (validate --reserve-only)")
        if self.cp.n_seq != 1:
            raise BadInput(f"-np {self.cp.n_seq}: the runtime decodes one sequence (-np 1); it only sizes more "
                           f"(validate --reserve-only)")
        if self.kv.type_k not in KV_CACHE_TYPES or self.kv.type_v not in KV_CACHE_TYPES:
            raise BadInput(f"-ctk {self.flags.cache_type_k} -ctv {self.flags.cache_type_v}: the runtime decodes "
                           f"f16 and f32 KV caches only; it only sizes others (validate --reserve-only)")

    def _ubatch(self, tokens: np.ndarray, all_logits: bool) -> np.ndarray:
        self._check_executable()
        assert self.kv is not None
        positions = np.arange(self.n_past, self.n_past + len(tokens), dtype=np.int64)
        cells = {k: t.store(positions) for k, t in self.kv.tables.items()}
        out_rows = np.arange(len(tokens)) if all_logits else np.array([len(tokens) - 1])
        shape = BatchShape(len(tokens), len(out_rows),
                           tuple((k, self.kv.tables[k].n_kv()) for k in self.kv.kind_order()))
        built = self._graph(shape)
        for b in self.backends.values():
            if isinstance(b, TimedMetaBackend):
                b.clear()
            b.split_seconds = []
        t0 = time.perf_counter()
        m = self.sched.compute(built.graph, self._inputs(built, tokens, positions, cells, out_rows))
        seconds = time.perf_counter() - t0
        per_split = {name: sum(b.split_seconds) for name, b in self.backends.items() if b.split_seconds}
        meta = [b.count() for b in self.backends.values() if isinstance(b, TimedMetaBackend)]
        reduces = ReduceCount(sum(c.n_reduces for c in meta), sum(c.bytes_moved for c in meta)) if meta else None
        self.steps.append(StepRecord(len(tokens), m, seconds, per_split, reduces))
        self.n_past += len(tokens)
        return built.logits.get_data().reshape(len(out_rows), self.hp.n_vocab).copy()

    def decode(self, tokens: Sequence[int], all_logits: bool = True) -> np.ndarray:
        """Run token ids after what the cache holds, in ubatches of n_ubatch; logits of every
        token (all_logits) or of the last one."""
        self._check_executable()
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.size == 0:
            raise ValueError("decode needs at least one token")
        if ids.min() < 0 or ids.max() >= self.hp.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.hp.n_vocab})")
        outs = []
        for start in range(0, len(ids), self.cp.n_ubatch):
            chunk = ids[start:start + self.cp.n_ubatch]
            last = start + len(chunk) == len(ids)
            outs.append(self._ubatch(chunk, all_logits or not last) if (all_logits or last)
                        else self._ubatch(chunk, False)[:0])
        return np.concatenate(outs, axis=0)

    def generate(self, prompt: Sequence[int], n_new: int) -> list[int]:
        """Greedy continuation of `prompt` by n_new tokens."""
        logits = self.decode(prompt, all_logits=False)
        out: list[int] = []
        for _ in range(n_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            logits = self.decode([tok], all_logits=False)
        return out

    def reset(self) -> None:
        """Forget the sequence (the cache cells), keep weights and buffers."""
        assert self.kv is not None
        self.kv.clear()
        self.n_past = 0
        self.steps = []

    def dequantize_weights(self) -> None:
        """Fill the kernels' f32 cache now rather than on first use, as far as it has room
        (runtime/ggml/dequant.py); the weights past it are dequantized in row bands on use. The token
        embedding only gives rows (get_rows dequantizes those alone) unless it is the output matrix too."""
        embd, output = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight", TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight"
        for name, t in self.weights.items():
            if t.type not in (GGMLType.F32, GGMLType.F16) and not (name == embd and output in self.weights):
                prefetch_f32(t)

    def compute_bytes(self) -> dict[str, int]:
        """Compute buffer per device now (buffers only grow: after a run, the peak)."""
        return {b.name: self.sched.buffer_size(b) for b in self.sched.backends}
