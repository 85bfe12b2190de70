"""The per-token widths a model's graph materialises, read from its weights and facts.

The analytic compute model sizes activations from these; they depend on the model alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.arch import ModelFacts
from planner.model.tensors import is_shared_expert, layer_of


@dataclass(frozen=True)
class Shapes:
    """Per-token widths (elements) of the tensors a layer materialises, from the model's weights."""

    n_embd: int
    n_ff: int            # dense FFN width
    n_ff_moe: int        # n_expert_used x expert width (0 without routed experts)
    shared_experts: bool
    n_expert_used: int
    q_width: int         # n_head x head_dim_k
    kv_width: int        # n_head_kv x head_dim
    n_head: int
    n_vocab: int
    ssm_in: int          # Mamba-2 in_proj output width (0 without SSM layers)
    ssm_conv: int        # conv channels (d_inner + 2 n_group d_state)
    ssm_inner: int


def model_shapes(model: ModelFile, facts: ModelFacts) -> Shapes:
    f, meta = facts, model.metadata
    n_ff = n_ff_moe = 0
    shared = False
    for t in model.tensors:
        if len(t.shape) < 2 or not (".ffn_up" in t.name or ".ffn_gate" in t.name) or "_inp" in t.name:
            continue
        if len(t.shape) == 3:
            n_ff_moe = max(n_ff_moe, t.shape[1] * max(1, f.n_expert_used))
        else:
            n_ff = max(n_ff, t.shape[1])
            shared = shared or is_shared_expert(layer_of(t.name)[1])
    q = max((lf.n_head * lf.head_dim_k for lf in f.layers), default=f.n_embd)
    kv = max((lf.n_head_kv * max(lf.head_dim_k, lf.head_dim_v) for lf in f.layers), default=0)
    n_head = max((lf.n_head for lf in f.layers), default=1)
    arch = f.arch
    d_inner = int(meta.get(Keys.SSM.INNER_SIZE.format(arch=arch), 0) or 0)
    d_state = int(meta.get(Keys.SSM.STATE_SIZE.format(arch=arch), 0) or 0)
    n_group = int(meta.get(Keys.SSM.GROUP_COUNT.format(arch=arch), 0) or 0)
    n_ssm_head = int(meta.get(Keys.SSM.TIME_STEP_RANK.format(arch=arch), 0) or 0)
    conv = d_inner + 2 * n_group * d_state
    return Shapes(f.n_embd, n_ff, n_ff_moe, shared, max(1, f.n_expert_used), q, kv, n_head, f.n_vocab,
                  d_inner + conv + n_ssm_head if d_inner else 0, conv if d_inner else 0, d_inner)
