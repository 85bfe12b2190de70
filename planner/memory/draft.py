"""The speculative drafter's memory (`-md`): what the pinned llama-server allocates for it on each device.

The drafter is a second model and context in the same process (common/speculative.cpp
common_speculative_init_result), built from the target's parameters with its own layered on top
(common_base_params_to_speculative; planner/llama/companions.py derives its flags):
- weights: its own -ngld / -devd / -otd / -cmoed / -ncmoed rules on its own layers, the target's
  -ts / -sm / -mg otherwise (one -devd device splits by layer);
- KV: as many cells as the TARGET context (cparams.n_ctx = llama_n_ctx(ctx_tgt); -np, -kvu,
  --swa-full, -nkvo inherited), of its own -ctkd / -ctvd types, sized by its own window: seed 003 §6,
  ctx_tgt x layers x 2 x kv_heads x head_dim x dtype unless the drafter declares a sliding window;
- compute: the same reserve as the target's (planner/memory/analytic.compute_model, the runtime's
  replay where a graph builder exists), with the drafter's output rows: n_outputs_max = -np, or
  -np x (n_max + 1) with a block drafter (planner.llama.companions.draft_outputs_max).

`check_borrowed_output`: a drafter that runs the target's output matrix (DFlash, EAGLE3 without their own)
needs a backend for the buffer it lies in, or llama.cpp aborts creating the draft context.

`speculation_refusal` is common_speculative_are_compatible: llama-server loads the drafter first and
checks the vocabularies only when speculation starts (server-context.cpp load_model); a refused or
unused drafter is freed then, so its memory is needed at load all the same.
"""
from __future__ import annotations

from planner.core.errors import DrafterOutputUnreachable, FlagError
from planner.gguf.vocab import Vocab, VocabType, token_texts, vocab_of
from planner.hardware.inventory import Inventory
from planner.llama.companions import block_draft_limit, borrows_target_output, draft_flags, draft_outputs_max
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import DRAFT_SPEC_TYPES
from planner.llama.kv import context_bytes, layer_caches
from planner.llama.placement import CPU_REPACK, HOST, HOST_ROWS
from planner.llama.settings import LlamaSettings, resolve_settings
from planner.llama.tensor_parallel import META_NAME
from planner.memory.analytic import compute_model
from planner.memory.rows import CompanionEstimate, DeviceMemory, weight_rows
from planner.model.tensors import OUTPUT, TOKEN_EMBD

DRAFT = "draft"   # CompanionEstimate.kind

# common/speculative.cpp: how far the vocabulary sizes may differ, and the first token id whose text
# is compared (the ids below it are special tokens that may differ)
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


def draft_settings(target: LlamaSettings, inventory: Inventory | None,
                   draft: ModelContext | None = None) -> LlamaSettings:
    """The drafter's flags (planner.llama.companions.draft_flags, its context as large as the target's
    resolved one) resolved on the drafter's model; `draft`: its context when the caller has it."""
    path = target.flags.spec.draft.model
    if not path:
        raise FlagError("no drafter: -md / --spec-draft-model is not set")
    ctx = draft if draft is not None else model_context(path)
    return resolve_settings(ctx, draft_flags(target.flags, target.cparams.n_ctx), inventory)


def estimate_draft(target: LlamaSettings, inventory: Inventory | None, exact_compute: bool = True,
                   draft: ModelContext | None = None) -> CompanionEstimate:
    """The drafter's rows (its devices in llama.cpp's order, then Host, then CPU_REPACK when it has
    repacked weights) and what llama-server would say about it. `draft`: the drafter's context, when
    the caller has read it already (a planner estimating many flag sets)."""
    settings = draft_settings(target, inventory, draft)
    check_borrowed_output(target, settings)
    weights = weight_rows(settings)
    kv = context_bytes(layer_caches(settings))
    # a drafter exists only in llama-server's and llama-cli's real load: its reserve keeps the norm pins
    compute, source = compute_model(settings, use_runtime=exact_compute,
                                    n_outputs_max=draft_outputs_max(target.flags), dry_run=False)
    names = [d.name for d in settings.devices] + [HOST] + ([CPU_REPACK] if weights.get(CPU_REPACK) else [])
    rows = tuple(DeviceMemory(n, weights.get(n, 0), kv.get(n, 0), compute.get(n, 0)) for n in names)
    return CompanionEstimate(DRAFT, settings.ctx.model.path, rows, source, draft_notes(target, settings.ctx))


def check_borrowed_output(target: LlamaSettings, drafter: LlamaSettings) -> None:
    """FlagError when the drafter runs the target's output matrix (companions.borrows_target_output) and
    none of its devices holds the buffer it lies in: llama.cpp aborts at the draft context's first reserve,
    "pre-allocated tensor (token_embd.weight) in a buffer (...) that cannot run the operation (NONE)"
    (ggml-backend.cpp:941; measured on two rpc-servers: -ts 1,1 -devd RPC0 aborts, -devd RPC1 runs; under
    -sm tensor the matrix is in the target's Meta() buffer, and a drafter pinned by -devd aborts while one
    that follows the target's devices runs)."""
    names = {t.name for t in drafter.ctx.model.tensors}
    if not borrows_target_output(drafter.ctx.model.architecture, names):
        return
    placed = dict(target.placement.tensor_buft)
    row = placed.get(OUTPUT, placed.get(TOKEN_EMBD, HOST))   # a tied matrix on the host is token_embd itself
    if row in HOST_ROWS or row in {d.name for d in drafter.devices}:
        return
    where = "the target's Meta() buffer (-sm tensor)" if row == META_NAME else f"{row}'s buffer"
    fix = ("leave out -devd so that the drafter follows the target's devices (or give it its own output.weight)"
           if row == META_NAME else f"use -devd {row}, the device holding the target's output layer")
    devices = ", ".join(d.name for d in drafter.devices) or "CPU"
    raise DrafterOutputUnreachable(
        f"the {drafter.ctx.model.architecture} drafter has no output matrix and runs the target's, which lies in "
        f"{where}; the drafter's devices ({devices}) cannot run it and llama.cpp aborts creating the draft context "
        f"('pre-allocated tensor in a buffer that cannot run the operation', ggml-backend.cpp:941): {fix}")


def draft_notes(target: LlamaSettings, draft: ModelContext) -> tuple[str, ...]:
    """What llama-server does with this drafter beyond allocating it (server-context.cpp load_model,
    common_speculative_init)."""
    types = [t for t in target.flags.spec.types if t != "none"]
    notes = []
    if not any(t in DRAFT_SPEC_TYPES for t in types):
        if types:
            notes.append(f"no --spec-type draft-*: the drafter stays loaded beside {', '.join(types)} "
                         "but drafts nothing")
        else:
            notes.append("no --spec-type draft-*: llama-server loads the drafter (its memory is needed at "
                         "load), finds no speculative implementation and frees it; nothing is drafted")
        return tuple(notes)
    limit = block_draft_limit(target.flags.spec.types, draft.model.metadata)
    n_max = target.flags.spec.draft.n_max
    if limit is not None and n_max > limit.n_draft_max:
        notes.append(f"--spec-draft-n-max {n_max} is more than {limit.spec_type} drafts with this drafter "
                     f"(block size {limit.block_size}: at most {limit.n_draft_max} tokens); llama.cpp clamps it "
                     f"to {limit.n_draft_max} with a warning but reserves the drafter's output rows for "
                     f"{n_max} (common/speculative.cpp): use --spec-draft-n-max {limit.n_draft_max}")
    refusal = speculation_refusal(target.ctx, draft)
    if refusal is not None:
        notes.append(f"speculation refused: {refusal}; llama-server starts without it and frees the drafter "
                     "after loading it (common_speculative_are_compatible)")
    return tuple(notes)


def speculation_refusal(target: ModelContext, draft: ModelContext) -> str | None:
    """Why the pinned llama.cpp would refuse to speculate with this drafter for this target
    (common/speculative.cpp common_speculative_are_compatible), in words; None when compatible."""
    vt, vd = vocab_of(target.model), vocab_of(draft.model)
    reason = _header_refusal(vt, vd)
    if reason is not None:
        return reason
    n = min(vt.n_tokens, vd.n_tokens)
    if n <= SPEC_VOCAB_CHECK_START_TOKEN_ID:
        return None
    if vt.vocab_type is VocabType.NONE:   # llama_vocab::token_get_text asserts a vocabulary
        return "neither model has a vocabulary (llama.cpp aborts comparing their token texts)"
    tt, td = token_texts(target.model), token_texts(draft.model)
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID
    if tt[start:n] == td[start:n]:
        return None
    i = next(i for i in range(start, n) if tt[i] != td[i])
    return f"token {i}'s text differs: target {_text(tt[i])}, drafter {_text(td[i])}"


def _header_refusal(vt: Vocab, vd: Vocab) -> str | None:
    """The checks that need no token text: type, BOS, EOS, sizes."""
    if vt.vocab_type is not vd.vocab_type:
        return (f"the vocabulary types differ: target {vt.vocab_type.name} ({vt.tokenizer_model!r}), "
                f"drafter {vd.vocab_type.name} ({vd.tokenizer_model!r})")
    for what, t_add, d_add, t_id, d_id in (("BOS", vt.add_bos, vd.add_bos, vt.bos_id, vd.bos_id),
                                           ("EOS", vt.add_eos, vd.add_eos, vt.eos_id, vd.eos_id)):
        if t_add != d_add:
            return (f"the target {'adds' if t_add else 'does not add'} {what}, "
                    f"the drafter {'does' if d_add else 'does not'}")
        if t_add and t_id != d_id:
            return f"the {what} tokens differ: target {t_id}, drafter {d_id}"
    diff = abs(vt.n_tokens - vd.n_tokens)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"the vocabulary sizes differ by {diff} (target {vt.n_tokens}, drafter {vd.n_tokens}; "
                f"at most {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})")
    return None


def _text(raw: bytes) -> str:
    return repr(raw.decode("utf-8", errors="replace"))
