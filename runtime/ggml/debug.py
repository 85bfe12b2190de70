"""GGML_SCHED_DEBUG=2-style text: split headers with their inputs, then one line per
non-view node with its backend and cause code, and each source's (seed 000 "What each code
means"; ggml_backend_sched_print_assignments). Returned as text: the library never prints.
"""
from __future__ import annotations

from collections.abc import Sequence

from planner.core.units import KiB, MiB
from runtime.ggml.backend import Backend
from runtime.ggml.graph import VIEW_OPS, Graph, Op, Tensor
from runtime.ggml.passes import Assignment
from runtime.ggml.splits import Split


def ggml_size(n_bytes: int) -> str:
    """ggml's fmt_size: whole MiB as 'NM' from 1 MiB up, else whole KiB as 'NK' (truncated).
    units.py has no truncating form, and this text must read like ggml's."""
    return f"{n_bytes // MiB}M" if n_bytes >= MiB else f"{n_bytes // KiB}K"


def op_desc(t: Tensor) -> str:
    """ggml_op_desc: unary and GLU nodes show their sub-op."""
    if t.op is Op.UNARY:
        return str(t.op_params.get("unary", "UNARY"))
    if t.op is Op.GLU:
        return str(t.op_params.get("glu", "GLU"))
    return t.op.value


def _where(t: Tensor, a: Assignment, backends: Sequence[Backend]) -> str:
    b = a.get(t)
    name = backends[b].name if b != -1 else "NULL"
    return f"[{name[:5]:>5} {a.causes.get(t, '')[:8]:>8}]"


def debug_text(graph: Graph, splits: Sequence[Split], a: Assignment, backends: Sequence[Backend]) -> str:
    lines: list[str] = []
    uses = graph.use_counts()
    starts = {s.i_start: (k, s) for k, s in enumerate(splits)}
    for i, node in enumerate(graph.nodes):
        if i in starts:
            k, split = starts[i]
            header = f"\n## SPLIT #{k}: {split.backend} # {len(split.inputs)} inputs"
            if split.inputs:
                header += ": " + " ".join(f"[{t.name} ({ggml_size(t.nbytes())[:5]:>5})]" for t in split.inputs)
            lines.append(header)
        if node.op in VIEW_OPS:
            continue
        line = (f"node #{i:3d} ({op_desc(node)[:10]:>10}): {node.name[:20]:>20} "
                f"({ggml_size(node.nbytes())[:5]:>5}) {_where(node, a, backends)} use={uses.get(node, 0)},c=1:")
        for src in node.src:
            if src is not None:
                line += f" {src.name[:20]:>20} ({ggml_size(src.nbytes())[:5]:>5}) {_where(src, a, backends)}"
        lines.append(line)
    return "\n".join(lines) + "\n"
