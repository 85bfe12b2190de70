"""The meta device's split-state resolver: every tensor's state from its sources' states.

Sources are resolved with `assume_sync=True`: a source that would be PARTIAL will have been
reduced by the time its consumer runs, so it reads as MIRRORED (ggml-backend-meta.cpp
ggml_backend_meta_get_split_state passes true for the sources). A dim-split result then takes
its per-member counts in the proportion of its first split source.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from gguf import GGML_QUANT_SIZES

from runtime.ggml.graph import Op, Tensor
from runtime.ggml.meta import MIRRORED, MetaSplitError, SplitAxis, SplitState, split_error
from runtime.ggml.meta_rules import SPLIT_RULES, Rule, SrcStates

StaticStates = Callable[[Tensor], SplitState]


def mirrored_leaves(tensor: Tensor) -> SplitState:
    """A static callback that mirrors everything (graph inputs on the meta device are mirrored)."""
    return MIRRORED


class SplitResolver:
    """Resolves and caches every tensor's split state over `n_devices` members.

    `static` gives leaves (op NONE: weights, caches, inputs) their state, as llama.cpp's
    llama_meta_device_get_split_state does. The cache is keyed on (tensor, assume_sync), like
    the meta buffer's split_state_cache; one resolver serves one graph (ggml invalidates by
    comparing the tensor struct, which a fresh resolver per graph makes unnecessary).
    """

    def __init__(self, n_devices: int, static: StaticStates = mirrored_leaves,
                 rules: Mapping[Op, Rule] = SPLIT_RULES) -> None:
        if n_devices < 1:
            raise MetaSplitError(f"a meta device needs at least one member, got {n_devices}")
        self.n_devices = n_devices
        self._static = static
        self._rules = rules
        self._cache: dict[tuple[Tensor, bool], SplitState] = {}

    def state(self, tensor: Tensor, assume_sync: bool = False) -> SplitState:
        key = (tensor, assume_sync)
        hit = self._cache.get(key)
        if hit is None:
            # sources first, iteratively: 100-layer graphs nest deeper than Python's recursion limit
            stack = [tensor]
            while stack:
                t = stack[-1]
                pending = [s for s in t.src if s is not None and s is not t and (s, True) not in self._cache]
                if pending and t.op is not Op.NONE:
                    stack.extend(pending)
                    continue
                stack.pop()
                for flag in ((True, False) if t is tensor else (True,)):
                    if (t, flag) not in self._cache:
                        self._cache[(t, flag)] = self._compute(t, flag)
            hit = self._cache[key]
        return hit

    def _compute(self, t: Tensor, assume_sync: bool) -> SplitState:
        if t.n_elements == 0:
            raise split_error(t, "a tensor without elements has no split state")
        if t.op is Op.NONE:
            return self._checked_static(t)
        rule = self._rules.get(t.op)
        if rule is None:
            raise split_error(t, f"no split-state rule for op {t.op.value}")
        src_ss = [None if s is None or s is t else self._cache[(s, True)] for s in t.src]
        out = rule(t, src_ss, assume_sync)
        if out.axis.is_dim:
            out = self._take_ratio(t, out, src_ss)
        return out

    def _checked_static(self, t: Tensor) -> SplitState:
        s = self._static(t)
        if s.axis.is_dim:
            if len(s.ne) != self.n_devices or sum(s.totals()) != t.ne[s.axis]:
                raise split_error(t, f"static split {s.ne} x{s.nr} does not cover ne[{int(s.axis)}] = {t.ne[s.axis]}"
                               f" over {self.n_devices} members")
            block = GGML_QUANT_SIZES[t.type][0] if s.axis is SplitAxis.AXIS_0 else 1
            if any(n % block for n in s.ne):
                raise split_error(t, f"slices {s.ne} are not whole blocks of {block}")
        return s

    def _take_ratio(self, t: Tensor, out: SplitState, src_ss: SrcStates) -> SplitState:
        """Per-member counts along the output axis, in the proportion of the first split source;
        every other split source must agree (the tail of ggml_backend_meta_get_split_state)."""
        ne: list[int] | None = None
        for s, src in zip(src_ss, t.src, strict=True):
            if s is None or src is None or not s.axis.is_dim:
                continue
            src_ne = src.ne[s.axis]
            if ne is None:
                ne = []
                for total in s.totals():
                    n = total * t.ne[out.axis]
                    div = src_ne * out.nr
                    if (n or src_ne) and n % div:
                        raise split_error(t, f"{src.name!r}'s split does not map onto whole elements")
                    ne.append(n // div if (n or src_ne) else n)
            elif any(n * out.nr * src_ne != total * t.ne[out.axis] for n, total in zip(ne, s.totals(), strict=True)):
                raise split_error(t, f"{src.name!r} is split in another proportion")
        if ne is None:
            raise split_error(t, f"{out.axis.name} result without a split source")
        return SplitState(out.axis, tuple(ne), out.nr)

    def computes(self, tensor: Tensor, member: int) -> bool:
        """GGML_TENSOR_FLAG_COMPUTE of the member's slice: cleared when a split source leaves this
        member nothing (ggml_backend_meta_buffer_init_tensor_impl)."""
        for s in tensor.src:
            if s is None or s is tensor:
                continue
            st = self.state(s, assume_sync=True)
            if st.axis.is_dim and st.totals()[member] == 0:
                return False
        return True

