"""Graph IR: tensors and graphs shaped like ggml's, so the scheduler rules carry over verbatim.

Shapes use ggml's order: `ne[0]` is the row length (fastest-varying), `nb[i]` the byte stride
of dimension i. Types are gguf-py's `GGMLQuantizationType`; byte sizes come from its
`GGML_QUANT_SIZES[type] -> (block_size, type_size)` table (STYLE.md: import gguf-py's tables).

A `Tensor` is mutable on purpose: the scheduler rewires `src` to input copies in place (as
ggml does, seed 000 "What an input means") and the allocator stamps `buffer`/`offset`.
"""
from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGMLType = GGMLQuantizationType
MAX_DIMS = 4


class Op(enum.Enum):
    """ggml ops by their ggml names (the debug output prints these)."""

    NONE = "NONE"
    DUP = "DUP"
    ADD = "ADD"
    ADD_ID = "ADD_ID"
    SUB = "SUB"
    MUL = "MUL"
    DIV = "DIV"
    SQR = "SQR"
    SQRT = "SQRT"
    SUM_ROWS = "SUM_ROWS"
    NORM = "NORM"
    RMS_NORM = "RMS_NORM"
    MUL_MAT = "MUL_MAT"
    MUL_MAT_ID = "MUL_MAT_ID"
    SCALE = "SCALE"
    CLAMP = "CLAMP"
    SET_ROWS = "SET_ROWS"
    CPY = "CPY"
    CONT = "CONT"
    RESHAPE = "RESHAPE"
    VIEW = "VIEW"
    PERMUTE = "PERMUTE"
    TRANSPOSE = "TRANSPOSE"
    GET_ROWS = "GET_ROWS"
    DIAG_MASK_INF = "DIAG_MASK_INF"
    SOFT_MAX = "SOFT_MAX"
    ROPE = "ROPE"
    CONCAT = "CONCAT"
    ARGSORT = "ARGSORT"
    FLASH_ATTN_EXT = "FLASH_ATTN_EXT"
    UNARY = "UNARY"
    GLU = "GLU"
    IM2COL = "IM2COL"
    CONV_2D = "CONV_2D"
    POOL_2D = "POOL_2D"
    UPSCALE = "UPSCALE"
    SSM_CONV = "SSM_CONV"
    SSM_SCAN = "SSM_SCAN"
    REPEAT = "REPEAT"
    GATED_DELTA_NET = "GATED_DELTA_NET"
    PAD = "PAD"   # ggml_pad: qwen3vl's deepstack-wide embeddings (fused), gemma4's V rows before a wider cache
    MEAN = "MEAN"   # gemma3n: ggml_mean of the gate rows (activation sparsity)
    FILL = "FILL"              # mla: build_moe_ffn's grouped expert selection masks the other groups
    LIGHTNING_INDEXER = "LIGHTNING_INDEXER"   # mla: the DSA indexer's scores (ggml_lightning_indexer)
    TOP_K = "TOP_K"            # mla: the DSA indexer's top-k cells (ggml_top_k)
    ARANGE = "ARANGE"          # glm5: minimax-m3's MSA gathers (ggml_arange)
    DSV4_HC_PRE = "DSV4_HC_PRE"   # linear: kimi-k3's attention residuals mix their checkpoints with it
    # glm5n: glm5-next's (and deepseek4's) fused hyper-connection mixers (ggml_dsv4_hc_comb / ggml_dsv4_hc_post)
    DSV4_HC_COMB = "DSV4_HC_COMB"
    DSV4_HC_POST = "DSV4_HC_POST"
    POOL_1D = "POOL_1D"        # projb: the whisper-enc audio projectors' average pool (ggml_pool_1d)
    SIN = "SIN"                # projb: MiniCPM-V's resampler builds its 2-D sin/cos positions in the graph
    COS = "COS"
    CONV_2D_DW = "CONV_2D_DW"  # projb: LFM2-Audio's conformer (ggml_conv_2d_dw_direct, ggml_roll)
    ROLL = "ROLL"
    ROPE_BACK = "ROPE_BACK"    # dsv4: deepseek4's de-rotation of the attention output (ggml_rope_ext_back)
    GROUP_NORM = "GROUP_NORM"  # sdsim: stable-diffusion.cpp's VAE and UNet (ggml_group_norm)
    TIMESTEP_EMBEDDING = "TIMESTEP_EMBEDDING"   # sdsim: the UNet's sinusoidal time embedding

    # members are singletons: identity hashing keeps set/dict lookups in the passes cheap
    __hash__ = object.__hash__


# Metadata-only ops: no kernel, no memory of their own (ggml_is_view_op, ggml-backend.cpp).
VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})

# Ops whose output may take a dying parent's storage (ggml_op_can_inplace, ggml-alloc.c).
INPLACE_OPS = frozenset({
    Op.SCALE, Op.ADD, Op.ADD_ID, Op.SUB, Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.UNARY,
    Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX, Op.DIAG_MASK_INF, Op.CLAMP, Op.FILL,
    Op.ROPE_BACK,   # dsv4
})


class TensorFlag(enum.IntFlag):
    """ggml's GGML_TENSOR_FLAG_* values."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2
    PARAM = 4


# Plain-int copies for hot paths: IntFlag arithmetic costs a Python call per test.
FLAG_INPUT = int(TensorFlag.INPUT)
FLAG_OUTPUT = int(TensorFlag.OUTPUT)
FLAG_PARAM = int(TensorFlag.PARAM)


class BufferUsage(enum.Enum):
    """ggml_backend_buffer_usage: WEIGHTS drives the 1.wgt rule and the new-split-per-weight rule."""

    ANY = "ANY"
    WEIGHTS = "WEIGHTS"
    COMPUTE = "COMPUTE"


_NUMPY_DTYPES: dict[GGMLType, Any] = {
    GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.F64: np.float64,
    GGMLType.I8: np.int8, GGMLType.I16: np.int16, GGMLType.I32: np.int32, GGMLType.I64: np.int64,
}


def numpy_dtype(ggml_type: GGMLType) -> Any:
    """The numpy dtype a type is viewed as, or None for block-quantized types."""
    return _NUMPY_DTYPES.get(ggml_type)


# Memo of contiguous strides by (type, ne): a graph build asks for the same few shapes
# thousands of times (bench/bench_plan.py's 128-layer reserve builds ~20k tensors).
_STRIDES: dict[tuple[GGMLType, tuple[int, ...]], tuple[int, ...]] = {}
_STRIDES_MAX = 4096


def contiguous_strides(ggml_type: GGMLType, ne: Sequence[int]) -> tuple[int, ...]:
    key = (ggml_type, tuple(ne))
    nb = _STRIDES.get(key)
    if nb is not None:
        return nb
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    strides = [type_size, type_size * (ne[0] // block)]
    for i in range(2, MAX_DIMS):
        strides.append(strides[i - 1] * ne[i - 1])
    nb = tuple(strides)
    if len(_STRIDES) >= _STRIDES_MAX:
        _STRIDES.clear()
    _STRIDES[key] = nb
    return nb


_ids = itertools.count()


class Tensor:
    """A ggml tensor: shape, type, op and its params, sources, view source, flags, storage."""

    __slots__ = (
        "_nbytes",
        "buffer",
        "flags",
        "name",
        "nb",
        "ne",
        "offset",
        "op",
        "op_params",
        "src",
        "type",
        "uid",
        "view_offs",
        "view_src",
        "__weakref__",   # per-weight caches (runtime/ggml/exact.py) hold tensors weakly
    )

    # declared here, not only in __init__: __init__ reads a view source's own view fields
    # before it sets its own, and mypy cannot infer a type from that order
    view_src: Tensor | None
    view_offs: int

    def __init__(self, ggml_type: GGMLType, ne: Sequence[int], name: str = "", op: Op = Op.NONE,
                 src: Iterable[Tensor | None] = (), op_params: dict[str, Any] | None = None,
                 view_src: Tensor | None = None, view_offs: int = 0,
                 nb: Sequence[int] | None = None, flags: TensorFlag | int = 0) -> None:
        if not (type(ne) is tuple and len(ne) == MAX_DIMS and type(ne[0]) is int and type(ne[1]) is int
                and type(ne[2]) is int and type(ne[3]) is int):  # else normalise (most are already)
            ne = tuple(map(int, ne))
            if len(ne) != MAX_DIMS:
                ne += (1,) * (MAX_DIMS - len(ne))
        if len(ne) != MAX_DIMS or ne[0] < 0 or ne[1] < 0 or ne[2] < 0 or ne[3] < 0:
            raise ValueError(f"tensor {name!r}: bad shape {ne}")
        if view_src is not None and view_src.view_src is not None:
            # ggml collapses view chains onto the root tensor (ggml_new_tensor_impl)
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.uid = next(_ids)
        self.name = name
        # the enum call only when needed: it costs a Python call per tensor
        self.type = ggml_type if type(ggml_type) is GGMLType else GGMLType(ggml_type)
        self.ne: tuple[int, ...] = ne
        self.nb: tuple[int, ...] = tuple(nb) if nb is not None else contiguous_strides(self.type, ne)
        self.op = op
        self.op_params: dict[str, Any] = dict(op_params) if op_params else {}
        self.src: list[Tensor | None] = list(src)
        self.view_src = view_src
        self.view_offs = view_offs
        self.flags = flags if type(flags) is int else int(flags)  # TensorFlag bits as int (see FLAG_INPUT)
        self.buffer: Any = None  # a runtime.ggml.backend.Buffer once allocated (never set on views)
        self.offset = 0
        self._nbytes = -1  # ne and nb never change after construction

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op.value}, {self.type.name}, ne={self.ne})"

    def source(self, i: int) -> Tensor:
        """src[i], for a source the op cannot do without (build.py always sets it)."""
        s = self.src[i]
        if s is None:
            raise ValueError(f"tensor {self.name!r} ({self.op.value}): source {i} is missing")
        return s

    # --- sizes -----------------------------------------------------------------------------
    @property
    def n_elements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def n_rows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    def nbytes(self) -> int:
        """Bytes spanned by the tensor, as ggml_nbytes (honours non-contiguous strides)."""
        if self._nbytes < 0:
            self._nbytes = self._span()
        return self._nbytes

    def _span(self) -> int:
        ne, nb = self.ne, self.nb
        if ne[0] <= 0 or ne[1] <= 0 or ne[2] <= 0 or ne[3] <= 0:
            return 0
        block, type_size = GGML_QUANT_SIZES[self.type]
        rest = (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + (ne[3] - 1) * nb[3]
        if block == 1:
            return type_size + (ne[0] - 1) * nb[0] + rest
        return ne[0] * nb[0] // block + rest

    def is_contiguous(self) -> bool:
        return self.nb == contiguous_strides(self.type, self.ne)

    def same_layout(self, other: Tensor) -> bool:
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb

    # --- storage ---------------------------------------------------------------------------
    def storage(self) -> tuple[Any, int]:
        """(buffer, byte offset) of this tensor's first byte; a view resolves through its root."""
        if self.view_src is not None:
            root = self.view_src
            return root.buffer, root.offset + self.view_offs
        return self.buffer, self.offset

    def root_buffer(self) -> Any:
        return self.view_src.buffer if self.view_src is not None else self.buffer

    def numpy(self) -> np.ndarray:
        """A writable numpy view (numpy axis order ne3, ne2, ne1, ne0) of the tensor's bytes."""
        buffer, offset = self.storage()
        if buffer is None:
            raise ValueError(f"tensor {self.name!r} has no storage (not allocated)")
        dtype = numpy_dtype(self.type)
        if dtype is None:
            raise ValueError(f"tensor {self.name!r}: {self.type.name} has no element view; use kernels.read_f32")
        return np.ndarray(self.ne[::-1], dtype=dtype, buffer=buffer.storage, offset=offset,
                          strides=self.nb[::-1])

    def raw_bytes(self) -> np.ndarray:
        """The tensor's byte span (nbytes) as a uint8 view of its buffer."""
        buffer, offset = self.storage()
        if buffer is None:
            raise ValueError(f"tensor {self.name!r} has no storage (not allocated)")
        return buffer.storage[offset:offset + self.nbytes()]

    def set_data(self, values: Any) -> None:
        """Write values (broadcast to the tensor's numpy shape), or raw bytes for quantized types."""
        if numpy_dtype(self.type) is None:
            raw = np.frombuffer(np.ascontiguousarray(values).tobytes(), dtype=np.uint8)
            self.raw_bytes()[:] = raw
            return
        target = self.numpy()
        target[...] = np.asarray(values).reshape(target.shape) if np.size(values) == target.size else values

    def get_data(self) -> np.ndarray:
        """A copy of the values in numpy order, squeezed of trailing unit ggml dims."""
        arr = np.array(self.numpy())
        dims = max([i + 1 for i in range(MAX_DIMS) if self.ne[i] != 1] or [1])
        return arr.reshape(self.ne[:dims][::-1])


class Graph:
    """Nodes (computed tensors) and leafs (op NONE: weights, inputs, caches), in ggml's order.

    `build` walks sources depth-first, left to right, and appends a tensor after its sources,
    as ggml_build_forward_expand does; the walk is iterative so 100-layer graphs do not hit
    Python's recursion limit.
    """

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[Tensor] = set()

    @classmethod
    def build(cls, *outputs: Tensor) -> Graph:
        graph = cls()
        for out in outputs:
            graph.expand(out)
        return graph

    def expand(self, tensor: Tensor) -> None:
        seen = self._seen
        if tensor in seen:
            return
        nodes, leafs = self.nodes, self.leafs
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        while stack:
            t, i = stack.pop()
            src = t.src
            n = len(src)
            while i < n:   # the first source not yet in the graph, if any
                s = src[i]
                if s is not None and s not in seen:
                    break
                i += 1
            if i < n:
                stack.append((t, i + 1))
                stack.append((src[i], 0))  # type: ignore[arg-type]  # the loop stopped at a non-None source
                continue
            # a pushed source is unseen when pushed and the walk reaches it next (no cycles)
            seen.add(t)
            if t.op is Op.NONE and not t.flags & FLAG_PARAM:
                leafs.append(t)
            else:
                nodes.append(t)

    def use_counts(self) -> dict[Tensor, int]:
        """How many node sources reference each tensor (ggml's graph use_counts)."""
        counts: dict[Tensor, int] = {}
        for node in self.nodes:
            for s in node.src:
                if s is not None:
                    counts[s] = counts.get(s, 0) + 1
        return counts
