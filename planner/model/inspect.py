"""`fitplan inspect`: what a model file holds and what each layer costs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.core.render import table
from planner.core.units import fmt_bytes, mib
from planner.gguf.reader import ModelFile, read_model
from planner.model.arch import ModelFacts, model_facts
from planner.model.costs import CostTable, WeightGroup, cost_table
from planner.registry.examples import resolve_model


@dataclass(frozen=True)
class InspectResult:
    model: ModelFile
    facts: ModelFacts
    costs: CostTable

    def to_dict(self) -> dict[str, Any]:
        m, f, c = self.model, self.facts, self.costs
        return {
            "path": m.path,
            "architecture": f.arch,
            "gguf_version": m.version,
            "file_type": m.file_type,
            "n_params": m.n_params,
            "total_tensor_bytes": m.total_tensor_bytes,
            "n_layer": f.n_layer,
            "n_embd": f.n_embd,
            "n_vocab": f.n_vocab,
            "n_ctx_train": f.n_ctx_train,
            "experts": {"count": f.n_expert, "used": f.n_expert_used, "shared": f.n_expert_shared},
            "mla": f.mla,
            "kv_facts_known": f.known,
            "cache_type_k": c.type_k,
            "cache_type_v": c.type_v,
            "tied_embeddings": c.tied_embeddings,
            "layers": [{
                "layer": lc.index, "kind": lc.kind.value, "window": lc.window, "nextn": lc.nextn,
                "weights": {g.value: b for g, b in lc.weights}, "weight_bytes": lc.weight_bytes,
                "k_bytes_per_cell": lc.k_bytes_per_cell, "v_bytes_per_cell": lc.v_bytes_per_cell,
                "state_bytes_per_seq": lc.state_bytes_per_seq,
            } for lc in c.layers],
            "non_repeating": [{"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape),
                               "bytes": t.n_bytes} for t in c.non_repeating],
            "totals": {"layer_weight_bytes": c.layer_weight_bytes,
                       "non_repeating_bytes": c.non_repeating_bytes,
                       "weight_bytes": c.total_weight_bytes},
        }

    def to_table(self) -> str:
        m, f, c = self.model, self.facts, self.costs
        groups = list(WeightGroup)
        rows = []
        for lc in c.layers:
            kind = lc.kind.value + (f"/{lc.window}" if lc.window else "") + (" mtp" if lc.nextn else "")
            rows.append([lc.index, kind, *(f"{mib(lc.group_bytes(g)):.2f}" for g in groups),
                         f"{mib(lc.weight_bytes):.2f}", f"{mib(lc.kv_bytes_per_cell * 1024):.2f}",
                         f"{mib(lc.state_bytes_per_seq):.2f}"])
        rows.append(["total", "", *(f"{mib(sum(lc.group_bytes(g) for lc in c.layers)):.2f}" for g in groups),
                     f"{mib(c.layer_weight_bytes):.2f}",
                     f"{mib(sum(lc.kv_bytes_per_cell for lc in c.layers) * 1024):.2f}",
                     f"{mib(sum(lc.state_bytes_per_seq for lc in c.layers)):.2f}"])
        head = (f"{m.path}\n{f.arch}: {f.n_layer} layers, n_embd {f.n_embd}, vocab {f.n_vocab}, "
                f"train ctx {f.n_ctx_train}, {m.n_params / 1e6:.1f} M params, "
                f"{fmt_bytes(m.total_tensor_bytes)} of tensors"
                + (f", {f.n_expert} experts ({f.n_expert_used} used)" if f.n_expert else "")
                + ("" if f.known else "\nKV facts unknown for this architecture: weights only"))
        layer_table = table(["layer", "kind", *(f"{g.value} MiB" for g in groups), "weights MiB",
                             f"KV/1k MiB ({c.type_k}/{c.type_v})", "state/seq MiB"], rows)
        nr = table(["non-repeating tensor", "type", "MiB"],
                   [[t.name, t.ggml_type.name, f"{mib(t.n_bytes):.2f}"] for t in c.non_repeating]
                   + [["total", "", f"{mib(c.non_repeating_bytes):.2f}"]])
        tied = "\n(tied embeddings: token_embd.weight doubles as the output matrix)" if c.tied_embeddings else ""
        return f"{head}\n\n{layer_table}\n\n{nr}{tied}\n"


def inspect(model: str, type_k: str = "f16", type_v: str = "f16") -> InspectResult:
    """Read a model's header and cost every layer (`model` may be `example:NAME`)."""
    mf = read_model(resolve_model(model))
    facts = model_facts(mf)
    return InspectResult(mf, facts, cost_table(mf, facts, type_k, type_v))
