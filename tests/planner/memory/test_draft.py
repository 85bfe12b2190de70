"""The drafter's memory (planner/memory/draft.py) and llama.cpp's refusal rule, on hand-built headers.

Expected figures are worked out here from the definitions: seed 003 §6 (draft KV = target context x
layers x 2 x kv_heads x head_dim x dtype, unless the drafter has a sliding window), the pinned
llama-kv-cache-iswa.cpp (a window's cells: pad(window + n_ubatch, 256)) and common/speculative.cpp
common_speculative_are_compatible.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import Keys

from planner.llama.companions import draft_flags, draft_outputs_max
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.draft import estimate_draft, speculation_refusal
from planner.synth.draft_models import drafter_spec

KiB, MiB, GiB = 2**10, 2**20, 2**30
N_VOCAB = 300
RPC = "--rpc 127.0.0.1:50052,127.0.0.1:50053"


def _vocab(n: int = N_VOCAB, **keys: Any) -> dict[str, Any]:
    vocab: dict[str, Any] = {Keys.Tokenizer.MODEL: "llama", Keys.Tokenizer.LIST: [f"t{i}" for i in range(n)]}
    vocab.update({getattr(Keys.Tokenizer, k): v for k, v in keys.items()})
    return vocab


def _write(path: Path, vocab: dict[str, Any], **dims: Any) -> ModelContext:
    drafter_spec(vocab, **dims).write(path)
    return model_context(str(path))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("draft")
    # the target: a 7-layer gemma3 (6 windowed layers and one global) with the same vocabulary
    target = d / "target.gguf"
    drafter_spec(_vocab(), n_layer=7, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, window=128).write(target)
    plain, windowed = d / "drafter.gguf", d / "drafter-swa.gguf"
    drafter_spec(_vocab()).write(plain)                    # 5 layers, 8 KV heads of 128, no window
    drafter_spec(_vocab(), window=2048).write(windowed)   # the same with a 2048-token window
    return {"target": str(target), "plain": str(plain), "windowed": str(windowed)}


def _target(files: dict[str, str], flags: str, drafter: str = "plain"):
    argv = flags.split() + ["-md", files[drafter], "--spec-type", "draft-simple"]
    return resolve_settings(model_context(files["target"]), parse_llama_flags(argv), None)


def _kv(est) -> int:
    return sum(d.context_bytes for d in est.devices)


# --- the derived flags --------------------------------------------------------------------------

def test_draft_flags_take_the_drafters_own_and_inherit_the_rest(files):
    target = _target(files, f"{RPC} -c 5000 -np 2 -ngl 3 -ts 1,1 -b 1024 -ub 256 -ngld 2 -devd RPC1 "
                            "-ctkd q8_0 -ctvd q4_0 -fa on")
    f = draft_flags(target.flags, target.cparams.n_ctx)
    # -c 5000 over 2 sequences: 2 x pad(2560, 256) = 5120 cells, which the drafter copies
    assert f.n_ctx == 5120 == target.cparams.n_ctx
    assert (f.n_gpu_layers, f.devices, f.cache_type_k, f.cache_type_v) == (2, ("RPC1",), "q8_0", "q4_0")
    assert (f.n_parallel, f.n_batch, f.n_ubatch, f.tensor_split, f.flash_attn) == (2, 1024, 256, (1.0, 1.0), "on")
    assert f.split_mode == "layer" and not f.spec.has_draft


def test_draft_outputs_max_is_one_row_per_sequence_or_a_block():
    assert draft_outputs_max(parse_llama_flags(["-np", "3", "-md", "x"])) == 3
    # draft-dflash decodes anchor + n_max masks per sequence (common_base_params_to_speculative)
    f = parse_llama_flags(["-np", "3", "-md", "x", "--spec-type", "draft-dflash", "--spec-draft-n-max", "7"])
    assert draft_outputs_max(f) == 3 * 8


# --- seed 003 §6: the drafter's KV from the target's context --------------------------------------

def test_windowless_drafter_at_262144_target_positions_holds_5_gib(files):
    est = estimate_draft(_target(files, "-c 262144"), None, exact_compute=False)
    per_position = 5 * 2 * 8 * 128 * 2          # layers x (K, V) x kv_heads x head_dim x f16
    assert per_position == 20 * KiB
    assert _kv(est) == 262144 * per_position == 5 * GiB


def test_windowed_drafter_holds_its_window_and_one_ubatch(files):
    est = estimate_draft(_target(files, "-c 262144", "windowed"), None, exact_compute=False)
    # seed 003 §6's "≈ 40 MiB" is the 2048-position window alone (2048 x 20 KiB); the pinned
    # llama-kv-cache-iswa.cpp gives a window's cache pad(n_swa + n_ubatch, 256) cells: 2560 x 20 KiB
    assert 2048 * 20 * KiB == 40 * MiB
    assert _kv(est) == 2560 * 20 * KiB == 50 * MiB
    est = estimate_draft(_target(files, "-c 262144 -ub 256", "windowed"), None, exact_compute=False)
    assert _kv(est) == 2304 * 20 * KiB
    est = estimate_draft(_target(files, "-c 262144 --swa-full", "windowed"), None, exact_compute=False)
    assert _kv(est) == 5 * GiB


def test_drafter_cache_types_are_its_own(files):
    est = estimate_draft(_target(files, "-c 4096 -ctk f32 -ctkd q8_0 -ctvd q8_0 -fa on"), None, exact_compute=False)
    row = 8 * 128 // 32 * 34                    # 1024 values of q8_0: 32-value blocks of 34 bytes
    assert _kv(est) == 4096 * 5 * 2 * row


def test_a_drafter_on_one_rpc_device_has_its_rows_there(files):
    est = estimate_draft(_target(files, f"{RPC} -c 4096 -ts 1,1 -devd RPC1"), None, exact_compute=False)
    assert [d.name for d in est.devices] == ["RPC1", "Host"]
    assert est.device("RPC1").context_bytes == 4096 * 20 * KiB
    assert est.device("Host").context_bytes == 0
    assert est.device("RPC1").model_bytes > 0 and est.kind == "draft" and est.compute_model == "formula"


def test_notes_say_when_the_drafter_drafts_nothing(files):
    def notes(spec: str) -> tuple[str, ...]:
        argv = ["-c", "4096", "-md", files["plain"], *spec.split()]
        return estimate_draft(resolve_settings(model_context(files["target"]), parse_llama_flags(argv), None),
                              None, exact_compute=False).notes

    assert "frees it" in notes("")[0]
    assert "stays loaded beside ngram-simple" in notes("--spec-type ngram-simple")[0]
    assert notes("--spec-type draft-simple") == ()


def test_a_draft_longer_than_the_block_is_clamped_and_named(tmp_path, files):
    """common_speculative_impl_draft_dflash: DFlash drafts at most block_size - 1 tokens (its input is the
    anchor and block_size - 1 masks), anchor-first DSpark block_size; a longer --spec-draft-n-max is
    clamped to that with a warning, and the drafter's context already reserved n_max + 1 rows a sequence."""
    path = tmp_path / "dflash-like.gguf"
    spec = drafter_spec(_vocab())
    spec.metadata["dflash.block_size"] = 8   # a key of its own, not {arch}.*: the writer takes it as given
    spec.write(path)

    def notes(spec_flags: str) -> tuple[str, ...]:
        argv = ["-c", "4096", "-md", str(path), *spec_flags.split()]
        return estimate_draft(resolve_settings(model_context(files["target"]), parse_llama_flags(argv), None),
                              None, exact_compute=False).notes

    assert notes("--spec-type draft-dflash --spec-draft-n-max 7") == ()
    [note] = notes("--spec-type draft-dflash --spec-draft-n-max 8")
    assert "block size 8: at most 7 tokens" in note and note.endswith("use --spec-draft-n-max 7")
    assert notes("--spec-type draft-dspark --spec-draft-n-max 8") == ()   # anchor-first: the whole block
    # without the key the pinned build assumes a block of 16
    def plain(n: int) -> tuple[str, ...]:
        argv = ["-c", "4096", "-md", files["plain"], "--spec-type", "draft-dflash", "--spec-draft-n-max", str(n)]
        return estimate_draft(resolve_settings(model_context(files["target"]), parse_llama_flags(argv), None),
                              None, exact_compute=False).notes
    assert plain(15) == () and "use --spec-draft-n-max 15" in plain(16)[0]


# --- common_speculative_are_compatible ------------------------------------------------------------

@pytest.fixture
def pair(tmp_path):
    def make(target_vocab: dict[str, Any], draft_vocab: dict[str, Any]) -> str | None:
        t = _write(tmp_path / "t.gguf", target_vocab, n_layer=1, n_embd=64, n_head=2, n_head_kv=1, head_dim=32)
        d = _write(tmp_path / "d.gguf", draft_vocab, n_layer=1, n_embd=64, n_head=2, n_head_kv=1, head_dim=32)
        return speculation_refusal(t, d)
    return make


def test_the_same_vocabulary_is_compatible(pair):
    assert pair(_vocab(BOS_ID=1, EOS_ID=2), _vocab(BOS_ID=1, EOS_ID=2)) is None


def test_vocabulary_types_must_match(pair):
    assert "types differ" in pair(_vocab(), _vocab(MODEL="gpt2"))


def test_bos_must_match_when_added(pair):
    # SPM adds BOS by default: an explicit add_bos_token false differs from an absent key
    assert "adds BOS" in pair(_vocab(), _vocab(ADD_BOS=False))
    assert "BOS tokens differ" in pair(_vocab(BOS_ID=1), _vocab(BOS_ID=3))
    # without BOS added the ids are not compared
    assert pair(_vocab(ADD_BOS=False, BOS_ID=1), _vocab(ADD_BOS=False, BOS_ID=3)) is None
    # BPE adds BOS only for some pre-tokenizers (llama-bpe does, default does not)
    assert "adds BOS" in pair(_vocab(MODEL="gpt2", PRE="llama-bpe"), _vocab(MODEL="gpt2", PRE="default"))


def test_eos_must_match_when_added(pair):
    assert "adds EOS" in pair(_vocab(ADD_EOS=True), _vocab())
    assert "EOS tokens differ" in pair(_vocab(ADD_EOS=True, EOS_ID=2), _vocab(ADD_EOS=True, EOS_ID=4))
    assert pair(_vocab(EOS_ID=2), _vocab(EOS_ID=4)) is None   # SPM adds no EOS by default


def test_sizes_may_differ_by_at_most_128(pair):
    assert pair(_vocab(), _vocab(N_VOCAB + 128)) is None
    assert "differ by 129" in pair(_vocab(), _vocab(N_VOCAB + 129))


def test_token_texts_from_id_5_must_match(pair):
    texts = [f"t{i}" for i in range(N_VOCAB)]
    below = [*texts[:4], "other", *texts[5:]]          # id 4: below SPEC_VOCAB_CHECK_START_TOKEN_ID
    at = [*texts[:5], "other", *texts[6:]]             # id 5: compared
    assert pair(_vocab(), _vocab(LIST=below)) is None
    assert "token 5's text differs" in pair(_vocab(), _vocab(LIST=at))
