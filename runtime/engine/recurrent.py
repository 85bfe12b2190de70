"""Recurrent states and the Mamba-2 mixer, as the pinned llama.cpp builds them (DESIGN.md).

Facts (src/llama-memory-recurrent.cpp, src/llama-memory-hybrid.cpp, src/llama-graph.cpp build_rs
and build_rs_inp_impl, src/models/mamba-base.cpp build_mamba2_layer):
- per recurrent layer an f32 r (conv) state [n_embd_r, mem_size] and s (SSM) state
  [n_embd_s, mem_size] on the layer's device (CPU with -nkvo), mem_size = max(1, n_seq_max) cells
  (no rollback rows: n_rs_seq is 0 by default); the sizes are planner.model.arch's `state_r` and
  `state_s`, which planner/llama/kv.py counts as context memory;
- one graph input `rs_s_copy` [n_rs] I32 with two views, the first n_seqs cells and the rest; the
  worst-case reserve uses the whole memory (n_rs = mem_size, head 0, cell 0 cleared);
- build_rs clears one state (an in-place SCALE by 0), gathers the ubatch's states, and copies the
  others back in place; the mixer then projects, convolves (its last d_conv - 1 columns stored as
  the new r), scans (the new s stored from the scan's tail), gates with z and group-norms.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.reader import ModelFile
from planner.model.arch import AttnKind, ModelFacts
from planner.model.tensors import tensor_name
from runtime.engine.lora import Adapters
from runtime.ggml import build as B
from runtime.ggml import ssm
from runtime.ggml.graph import GGMLType, Graph, Tensor

F32, I32 = GGMLType.F32, GGMLType.I32
ELEMENT = 4   # f32 state and activation elements (llama-model.cpp create_memory: type_r = type_s = f32)


@dataclass(frozen=True)
class SsmParams:
    """llama_hparams' ssm_* fields (load_arch_hparams: the ssm.* keys)."""

    d_conv: int
    d_inner: int
    d_state: int
    n_head: int      # ssm_dt_rank: Mamba-2's heads
    n_group: int

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_head


def read_ssm_params(model: ModelFile) -> SsmParams:
    def need(template: str) -> int:
        key = template.format(arch=model.architecture)
        if key not in model.metadata:
            raise GGUFError(model.path, f"missing required key {key}")
        return int(model.metadata[key])

    p = SsmParams(need(Keys.SSM.CONV_KERNEL), need(Keys.SSM.INNER_SIZE), need(Keys.SSM.STATE_SIZE),
                  need(Keys.SSM.TIME_STEP_RANK), need(Keys.SSM.GROUP_COUNT))
    if p.n_head <= 0 or p.n_group <= 0 or p.d_inner % p.n_head or p.d_inner % p.n_group or p.d_conv < 1:
        raise GGUFError(model.path, f"inconsistent SSM sizes {p}")
    return p


def read_mamba1_params(model: ModelFile) -> tuple[int, int, int, int]:
    """Mamba-1's d_conv, d_inner, d_state and dt_rank (load_arch_hparams of mamba.cpp and jamba.cpp)."""
    def need(template: str) -> int:
        key = template.format(arch=model.architecture)
        if key not in model.metadata:
            raise GGUFError(model.path, f"missing required key {key}")
        return int(model.metadata[key])

    return (need(Keys.SSM.CONV_KERNEL), need(Keys.SSM.INNER_SIZE), need(Keys.SSM.STATE_SIZE),
            need(Keys.SSM.TIME_STEP_RANK))


class RecurrentStates:
    """The r and s tensors of every recurrent layer (storage is given by the caller)."""

    def __init__(self, facts: ModelFacts, n_seq: int, n_rs_seq: int = 0) -> None:
        """`n_rs_seq`: the rollback rows each cell keeps (llama_memory_recurrent: size x (1 + n_rs_seq) rows,
        group i holding the state i tokens back; a drafter that needs them sets it: common.h need_n_rs_seq)."""
        self.size = max(1, n_seq)
        self.n_rs_seq = n_rs_seq
        rows = self.size * (1 + n_rs_seq)
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        for lf in facts.layers:
            # falcon-h1's blocks attend and carry states (RecurrentRule.PARALLEL): they have state sizes too
            if lf.nextn or not (lf.kind is AttnKind.RECURRENT or lf.state_r or lf.state_s):
                continue
            self.r[lf.index] = Tensor(F32, (lf.state_r, rows), name=f"cache_r_l{lf.index}")
            self.s[lf.index] = Tensor(F32, (lf.state_s, rows), name=f"cache_s_l{lf.index}")

    def __bool__(self) -> bool:
        return bool(self.r)

    def tensors(self, il: int) -> list[Tensor]:
        return [self.r[il], self.s[il]] if il in self.r else []


@dataclass(frozen=True)
class RsInputs:
    """build_rs_inp_impl's input and views, with the memory context's figures."""

    s_copy: Tensor
    main: Tensor     # the ubatch's sequences
    extra: Tensor    # the other cells
    n_rs: int
    head: int
    rs_z: int        # the cell to clear, -1 for none

    @classmethod
    def reserve(cls, states: RecurrentStates, n_seqs: int) -> RsInputs:
        """The worst-case reserve's (llama_memory_recurrent_context is_full: n_rs = size, head 0, rs_z 0)."""
        n_rs = states.size
        s_copy = B.new_input(I32, (n_rs,), "rs_s_copy")
        main = B.view(s_copy, (n_seqs,), None, 0)
        extra = B.view(s_copy, (n_rs - n_seqs,), None, n_seqs * s_copy.nb[0])
        return cls(s_copy, main, extra, n_rs, 0, 0)


def ubatch_sequences(states: RecurrentStates, n_tokens: int) -> int:
    """How many sequences a ubatch holds: one run of tokens per sequence (the reserve's: n_seq_max)."""
    return states.size if n_tokens % states.size == 0 else 1


def token_embeddings(g: Graph, embd: Tensor, tokens: Tensor, embd_input: Tensor, name: str,
                     lora: Adapters | None = None) -> Tensor:
    """The token rows (with build_inp_embd's adapter rows when a pair patches token_embd), expanded
    before the unused embeddings input (ggml_build_forward_select)."""
    x = B.get_rows(embd, tokens, name=name)
    if lora:
        x = lora.embd(embd, tokens, x)
    g.expand(x)
    g.expand(embd_input)
    return x


GetRows = Callable[[Tensor, Tensor], Tensor]


def bare_name(tensor: T, il: int) -> str:
    """A layer tensor stored without a suffix (ssm_a, ssm_d: "no weight suffix", granite-hybrid.cpp)."""
    return tensor_name(tensor, il).removesuffix(".weight")


def build_rs(g: Graph, inp: RsInputs, s: Tensor, state_size: int, n_seqs: int,
             get_rows: GetRows | None = None) -> Tensor:
    """llm_graph_context::build_rs: the ubatch's states of cache `s`, [state_size, n_seqs] unless
    `get_rows` (states, ids) makes something else of them."""
    states = B.reshape(s, (state_size, s.ne[1]))
    clear = inp.rs_z >= 0
    zero = B.view(states, (state_size * clear,), None, inp.rs_z * states.nb[1] * clear)
    g.expand(ssm.scale_inplace(zero, 0.0))
    out = get_rows(states, inp.main) if get_rows else B.get_rows(states, inp.main)
    g.expand(out)
    extra = B.get_rows(states, inp.extra)
    n_extra = inp.n_rs - n_seqs
    dst = B.view(s, (state_size, n_extra), (s.nb[0], s.nb[1]), (inp.head + n_seqs) * s.nb[1])
    g.expand(B.cpy(extra, dst))
    return out


@dataclass
class Mamba2:
    """build_mamba2_layer for one ubatch of n_seqs sequences of n_seq_tokens tokens each. `norm`
    is the builder's build_norm (RMS, pinned as llama.cpp's "norm" tensors are); `lora` the applied
    adapters, on ssm_in and ssm_out (build_lora_mm in src/models/mamba-base.cpp)."""

    p: SsmParams
    weight: Callable[[str], Tensor]
    optional: Callable[[str], Tensor | None]
    norm: Callable[[Tensor, str, int], Tensor]
    graph: Graph
    rs: RsInputs
    states: RecurrentStates
    lora: Adapters = field(default_factory=Adapters)

    def __call__(self, cur: Tensor, il: int, n_seqs: int) -> Tensor:
        p, g = self.p, self.graph
        n_seq_tokens = cur.ne[1] // n_seqs
        r_all, s_all = self.states.r[il], self.states.s[il]
        mem_size = self.states.size
        conv = build_rs(g, self.rs, r_all, r_all.ne[0], n_seqs)
        conv = B.reshape(conv, (p.d_conv - 1, p.conv_dim, n_seqs))
        zx = self.lora.mm(self.weight(tensor_name(T.SSM_IN, il)), cur, name=f"ssm_in-{il}")
        zx = B.reshape(zx, (zx.ne[0], n_seq_tokens, n_seqs))
        z = B.view(zx, (p.head_dim, p.n_head, n_seq_tokens, n_seqs),
                   (ELEMENT, p.head_dim * zx.nb[0], zx.nb[1], zx.nb[2]), 0)
        xbc = B.view(zx, (p.conv_dim, n_seq_tokens, n_seqs), (ELEMENT, zx.nb[1], zx.nb[2]), p.d_inner * ELEMENT)
        dt = B.view(zx, (p.n_head, n_seq_tokens, n_seqs), (ELEMENT, zx.nb[1], zx.nb[2]),
                    (2 * p.d_inner + 2 * p.n_group * p.d_state) * ELEMENT)
        # conv: the stored columns, then this ubatch's; the last d_conv - 1 become the new r
        conv_x = ssm.concat(conv, B.transpose(xbc), 0, name=f"conv_x-{il}")
        last = B.view(conv_x, (p.d_conv - 1, p.conv_dim, n_seqs), (ELEMENT, conv_x.nb[1], conv_x.nb[2]),
                      n_seq_tokens * conv_x.nb[0])
        row = (p.d_conv - 1) * p.conv_dim * ELEMENT
        g.expand(B.cpy(last, B.view(r_all, ((p.d_conv - 1) * p.conv_dim, n_seqs), (ELEMENT, r_all.nb[1]),
                                    self.rs.head * row)))
        xbc = ssm.ssm_conv(conv_x, self.weight(tensor_name(T.SSM_CONV1D, il)), name=f"ssm_conv-{il}")
        bias = self.optional(tensor_name(T.SSM_CONV1D, il, "bias"))
        if bias is not None:
            xbc = B.add(xbc, bias)
        xbc = B.silu(xbc)
        # scan: x, B and C are V, K and Q of the SSM/attention duality
        x = B.view(xbc, (p.head_dim, p.n_head, n_seq_tokens, n_seqs),
                   (ELEMENT, p.head_dim * ELEMENT, xbc.nb[1], xbc.nb[2]), 0)
        bc_ne = (p.d_state, p.n_group, n_seq_tokens, n_seqs)
        bc_nb = (ELEMENT, p.d_state * ELEMENT, xbc.nb[1], xbc.nb[2])
        b_ = B.view(xbc, bc_ne, bc_nb, p.d_inner * ELEMENT)
        c_ = B.view(xbc, bc_ne, bc_nb, (p.d_inner + p.n_group * p.d_state) * ELEMENT)
        dt = B.add(B.cont(dt), self.weight(tensor_name(T.SSM_DT, il, "bias")))
        a = self.weight(bare_name(T.SSM_A, il))

        def scan(states: Tensor, ids: Tensor) -> Tensor:
            s4 = B.reshape(states, (p.d_state, p.head_dim, p.n_head, s_all.ne[1]))
            return ssm.ssm_scan(s4, x, dt, a, b_, c_, ids, 1, name=f"ssm_scan-{il}")

        y_ssm = build_rs(g, self.rs, s_all, s_all.ne[0], n_seqs, scan)
        d = p.d_state * p.d_inner
        g.expand(B.cpy(B.view(y_ssm, (d, n_seqs, 1), (ELEMENT, d * ELEMENT, d * ELEMENT * n_seqs),
                              x.n_elements * ELEMENT),
                       B.view(s_all, (d, n_seqs, 1), (ELEMENT, s_all.nb[1], mem_size * d * ELEMENT),
                              self.rs.head * d * ELEMENT)))
        xn = x.nb[1]
        y = B.view(y_ssm, (p.head_dim, p.n_head, n_seq_tokens, n_seqs),
                   (ELEMENT, xn, p.n_head * xn, n_seq_tokens * p.n_head * xn), 0)
        y = B.add(y, B.mul(x, self.weight(bare_name(T.SSM_D, il))), name=f"mamba2_y_add_d-{il}")
        y = B.swiglu(B.cont(z), y)
        norm = self.optional(tensor_name(T.SSM_NORM, il))
        if norm is not None:
            y = B.reshape(y, (p.d_inner // p.n_group, p.n_group, n_seq_tokens, n_seqs))
            y = self.norm(y, tensor_name(T.SSM_NORM, il), il)
        y = B.reshape(y, (p.d_inner, n_seq_tokens * n_seqs))
        return self.lora.mm(self.weight(tensor_name(T.SSM_OUT, il)), y, name=f"mamba_out-{il}")


@dataclass
class Mamba1:
    """build_mamba_layer (src/models/mamba-base.cpp) for one ubatch of n_seqs sequences: Mamba-1's
    selective scan with one head per inner channel, d_state states each. ssm_in makes x and z; the
    conv state (d_conv - 1 columns of d_inner) joins x, its last columns are stored back; SSM_CONV,
    its bias and SiLU; ssm_x projects dt, B and C (RMS-normed where the layer has ssm_dt_norm,
    ssm_b_norm and ssm_c_norm, as Jamba's do; dt made contiguous otherwise); ssm_dt and its bias
    widen dt; the scan (build_rs over s) and its last states stored; y + x * D, gated by silu(z);
    ssm_out. `dt_rank` is ssm.time_step_rank."""

    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int
    weight: Callable[[str], Tensor]
    optional: Callable[[str], Tensor | None]
    norm: Callable[[Tensor, str, int], Tensor]
    graph: Graph
    rs: RsInputs
    states: RecurrentStates
    lora: Adapters = field(default_factory=Adapters)
    dt_b_c_rms_eps: float = 0.0   # ssm.dt_b_c_rms (Falcon-Mamba): dt, B and C RMS-normed without weights

    def __call__(self, cur: Tensor, il: int, n_seqs: int) -> Tensor:
        g, d_conv, d_inner, d_state, dt_rank = self.graph, self.d_conv, self.d_inner, self.d_state, self.dt_rank
        n_seq_tokens = cur.ne[1] // n_seqs
        r_all, s_all = self.states.r[il], self.states.s[il]
        conv = B.reshape(build_rs(g, self.rs, r_all, r_all.ne[0], n_seqs), (d_conv - 1, d_inner, n_seqs))
        cur = B.reshape(cur, (cur.ne[0], n_seq_tokens, n_seqs))
        xz = self.lora.mm(self.weight(tensor_name(T.SSM_IN, il)), cur, name=f"ssm_in-{il}")
        x = B.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (ELEMENT, xz.nb[1], xz.nb[2]), 0)
        z = B.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (ELEMENT, xz.nb[1], xz.nb[2]), d_inner * ELEMENT)
        conv_x = ssm.concat(conv, B.transpose(x), 0, name=f"conv_x-{il}")
        last = B.view(conv_x, (d_conv - 1, d_inner, n_seqs), (ELEMENT, conv_x.nb[1], conv_x.nb[2]),
                      n_seq_tokens * conv_x.nb[0])
        n_conv = (d_conv - 1) * d_inner
        g.expand(B.cpy(last, B.view(r_all, (n_conv * n_seqs,), None, self.rs.head * n_conv * ELEMENT)))
        x = ssm.ssm_conv(conv_x, self.weight(tensor_name(T.SSM_CONV1D, il)), name=f"ssm_conv-{il}")
        x = B.silu(B.add(x, self.weight(tensor_name(T.SSM_CONV1D, il, "bias"))))
        x_db = self.lora.mm(self.weight(tensor_name(T.SSM_X, il)), x, name=f"ssm_x-{il}")
        dt = B.view(x_db, (dt_rank, n_seq_tokens, n_seqs), (ELEMENT, x_db.nb[1], x_db.nb[2]), 0)
        bc_ne = (d_state, 1, n_seq_tokens, n_seqs)
        bc_nb = (ELEMENT, d_state * ELEMENT, x_db.nb[1], x_db.nb[2])
        b_ = B.view(x_db, bc_ne, bc_nb, dt_rank * ELEMENT)
        c_ = B.view(x_db, bc_ne, bc_nb, (dt_rank + d_state) * ELEMENT)
        norms = [tensor_name(k, il) for k in (T.SSM_DT_NORM, T.SSM_B_NORM, T.SSM_C_NORM)]
        weighted = all(self.optional(n) is not None for n in norms)
        if weighted:
            dt, b_, c_ = (self.norm(t, n, il) for t, n in zip((dt, b_, c_), norms, strict=True))
        elif self.dt_b_c_rms_eps:   # build_norm without weights: a bare RMS_NORM, not named "norm"
            dt, b_, c_ = (B.rms_norm(t, self.dt_b_c_rms_eps) for t in (dt, b_, c_))
        else:
            dt = B.cont(dt)
        dt = self.lora.mm(self.weight(tensor_name(T.SSM_DT, il)), dt, name=f"ssm_dt-{il}")
        dt = B.add(dt, self.weight(tensor_name(T.SSM_DT, il, "bias")))
        x_in = x
        x = B.reshape(x, (1, d_inner, n_seq_tokens, n_seqs))
        a = self.weight(bare_name(T.SSM_A, il))

        def scan(states: Tensor, ids: Tensor) -> Tensor:
            s4 = B.reshape(states, (d_state, 1, d_inner, s_all.ne[1]))
            return ssm.ssm_scan(s4, x, dt, a, b_, c_, ids, 1, name=f"ssm_scan-{il}")

        y_ssm = build_rs(g, self.rs, s_all, s_all.ne[0], n_seqs, scan)
        n_s = d_state * d_inner * n_seqs
        g.expand(B.cpy(B.view(y_ssm, (n_s,), None, x.nb[3] * x.ne[3]),
                       B.view(s_all, (n_s,), None, self.rs.head * d_state * d_inner * ELEMENT)))
        y = B.view(y_ssm, (d_inner, n_seq_tokens, n_seqs), (ELEMENT, x.nb[2], x.nb[3]), 0)
        y = B.add(y, B.mul(x_in, self.weight(bare_name(T.SSM_D, il))))
        y = B.swiglu(B.cont(z), y)
        y = self.lora.mm(self.weight(tensor_name(T.SSM_OUT, il)), y, name=f"mamba_out-{il}")
        return B.reshape(y, (y.ne[0], n_seq_tokens * n_seqs))
