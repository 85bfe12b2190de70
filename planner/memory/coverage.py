"""What the estimate does for each architecture, answered from the tables it runs on.

- KV: sized exactly where planner/model/arch.py has the architecture's layer facts (KNOWN_DENSE,
  SWA_RULES, RECURRENT_RULES: the same `known` test model_facts applies); elsewhere the layers are
  UNKNOWN and the estimate holds weights and compute only (context 0 MiB).
- Compute: simulated where runtime/engine has a graph builder (hparams.ARCHS; deepseek2.MLA_ARCHS
  for the files unsupported_reason passes; kimi.KDA_ARCHS and glm5next.GLM5_NEXT likewise;
  deepseek4.DEEPSEEK4), else
  planner/memory/analytic.py's formula.
- Projectors (`-mm`): simulated for clip_hparams.SUPPORTED, refused by name otherwise
  (UnsupportedProjector).

`architecture_coverage(name)` and `projector_coverage(name)` answer for one name; docs/coverage.md
is this module's answer over the pin's lists (planner/gguf/pin_lists.py). UNDECIDED is the answer
where the tables contradict one another (a builder without KV facts, two KV rules for one name) or
the name is not the pin's: a test fails on it for any name the pin lists.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from planner.gguf.pin_lists import pin_architectures, pin_projectors
from planner.llama.tensor_parallel import SM_TENSOR_UNSUPPORTED
from planner.model.arch import KNOWN_DENSE, RECURRENT_RULES, SWA_RULES
from runtime.engine.clip_hparams import SUPPORTED as PROJECTORS_SIMULATED
from runtime.engine.deepseek2 import MLA_ARCHS
from runtime.engine.deepseek4_hparams import DEEPSEEK4
from runtime.engine.glm5next import GLM5_NEXT
from runtime.engine.hparams import ARCHS
from runtime.engine.kimi import KDA_ARCHS


class Status(enum.Enum):
    SIMULATED = "simulated"         # KV exact, compute from the runtime's reserve
    FORMULA = "formula"             # KV exact, compute from the fitted formula
    WEIGHTS_ONLY = "weights-only"   # no KV facts: weights and formula compute, no context memory
    REFUSED = "refused"             # the estimate stops with the reason (projectors without a builder)
    UNDECIDED = "undecided"         # the tables disagree, or the name is not the pin's


@dataclass(frozen=True)
class Coverage:
    name: str
    status: Status
    kv: str          # "exact", "not sized", or "" for a projector
    compute: str     # "simulated", "formula", "" when refused
    reason: str      # why the status is what it is, in a sentence
    sm_tensor_refused: bool = False   # -sm tensor refused for it (llm_arch_supports_sm_tensor)


def _kv_rules(arch: str) -> list[str]:
    return [table for table, names in (("KNOWN_DENSE", KNOWN_DENSE), ("SWA_RULES", SWA_RULES),
                                       ("RECURRENT_RULES", RECURRENT_RULES)) if arch in names]


def _compute(arch: str) -> tuple[str, str]:
    if arch in MLA_ARCHS:
        return "simulated", ("graph builder runtime/engine/deepseek2.py (dsa.py for the DSA indexer) for MLA files "
                             "with split wk_b/wv_b; other files of it (deepseek2.unsupported_reason) use the formula")
    if arch in ARCHS:
        return "simulated", "graph builder in runtime/engine (hparams.ARCHS)"
    if arch == DEEPSEEK4:   # dsv4
        return "simulated", "graph builder runtime/engine/deepseek4.py (hyper-connections, CSA/HCA, the indexer)"
    if arch in KDA_ARCHS:
        return "simulated", ("graph builder runtime/engine/kimi.py (kimi_k3.py for kimi-k3: KDA layers beside MLA) "
                             "for files with split wk_b/wv_b; other files of it (kimi.unsupported_reason) use the "
                             "formula")
    if arch == GLM5_NEXT:   # glm5n
        return "simulated", ("graph builder runtime/engine/glm5next.py (KDA, nope MLA with the k-pool indexer, "
                             "hyper-connections) for the files glm5next.unsupported_reason passes; others use the "
                             "formula")
    return "formula", "no graph builder: compute is planner/memory/analytic.py's formula"


def architecture_coverage(arch: str) -> Coverage:
    """What the estimate does for a model of this GGUF architecture name."""
    sm = arch in SM_TENSOR_UNSUPPORTED
    if arch not in pin_architectures():
        return Coverage(arch, Status.UNDECIDED, "", "", "not an architecture of the pinned llama.cpp "
                        "(it stops with \"unknown model architecture\")", sm)
    rules = _kv_rules(arch)
    compute, why = _compute(arch)
    # KNOWN_DENSE with an SWA rule is how fitplan marks a dense model that may slide (lfm2 is both a
    # recurrent hybrid and SWA); only a dense and a recurrent rule at once contradict each other
    if "KNOWN_DENSE" in rules and "RECURRENT_RULES" in rules:
        return Coverage(arch, Status.UNDECIDED, "", compute, f"in both {' and '.join(rules)}", sm)
    if not rules:
        if compute == "simulated":
            return Coverage(arch, Status.UNDECIDED, "not sized", compute,
                            "a graph builder but no KV facts (planner/model/arch.py)", sm)
        return Coverage(arch, Status.WEIGHTS_ONLY, "not sized", compute,
                        "in no table of planner/model/arch.py, so model_facts marks its layers UNKNOWN: "
                        "weights and formula compute, no context memory", sm)
    kv_why = f"KV from {', '.join(rules)}"
    status = Status.SIMULATED if compute == "simulated" else Status.FORMULA
    return Coverage(arch, status, "exact", compute, f"{kv_why}; {why}", sm)


def projector_coverage(projector: str) -> Coverage:
    """What `-mm` does with a projector file of this clip.projector_type."""
    if projector not in pin_projectors():
        return Coverage(projector, Status.UNDECIDED, "", "", "not a projector type of the pinned mtmd")
    if projector in PROJECTORS_SIMULATED:
        return Coverage(projector, Status.SIMULATED, "", "simulated",
                        "graph builder in runtime/engine (clip_hparams.SUPPORTED)")
    return Coverage(projector, Status.REFUSED, "", "",
                    "no graph builder: refused by name (clip_hparams.UnsupportedProjector)")


def coverage_table() -> list[Coverage]:
    """One row per architecture of the pin, in the pin's order."""
    return [architecture_coverage(a) for a in pin_architectures()]


def projector_table() -> list[Coverage]:
    """One row per projector type of the pin's mtmd, in its order."""
    return [projector_coverage(p) for p in pin_projectors()]


def counts(rows: list[Coverage]) -> dict[Status, int]:
    """Rows per status, every status present (0 where none)."""
    return {s: sum(r.status is s for r in rows) for s in Status}
