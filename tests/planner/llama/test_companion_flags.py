"""Companion flags (drafter, projector, adapters) parsed as the pinned common/arg.cpp parses them."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.llama.companions import draft_flags, server_outputs_max, server_target_outputs_max
from planner.llama.flags import NGL_ALL, LoraArg, OverrideKind, flags_to_argv, parse_llama_flags


def _parse(text: str):
    """llama.cpp flags written as one line (no argument holds a space here)."""
    return parse_llama_flags(text.split(" "))


@pytest.mark.parametrize("spelling", ["-md", "--model-draft", "--spec-draft-model"])
def test_every_spelling_of_the_drafter(spelling):
    assert parse_llama_flags([spelling, "d.gguf"]).spec.draft.model == "d.gguf"


def test_drafter_options_land_on_the_drafter_only():
    f = _parse("-ngl 5 -ctk q8_0 -md d.gguf -ngld all -devd RPC1 -ctkd q4_0 -ctvd q8_0 -otd a=CPU -ncmoed 2 "
               "--spec-draft-n-max 7")
    d = f.spec.draft
    assert (f.n_gpu_layers, f.cache_type_k, f.override_args) == (5, "q8_0", ())
    assert (d.n_gpu_layers, d.devices, d.cache_type_k, d.cache_type_v, d.n_max) == (
        NGL_ALL, ("RPC1",), "q4_0", "q8_0", 7)
    assert [a.kind for a in d.override_args] == [OverrideKind.OT, OverrideKind.NCMOE]
    assert [o.pattern for o in d.overrides][1:] == [r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                                                   r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]


def test_spec_type_appends_to_the_default_list():
    # common/arg.cpp: --spec-type inserts after the default {"none"}
    f = parse_llama_flags(["--spec-type", "draft-simple,ngram-mod"])
    assert f.spec.types == ("none", "draft-simple", "ngram-mod")
    # the longest proposal: ngram-mod's n_max (64) over the drafter's 3 (common_speculative_n_max)
    assert f.spec.n_max == 64
    assert parse_llama_flags([]).spec.n_max == 0
    with pytest.raises(FlagError, match="--spec-type"):
        parse_llama_flags(["--spec-type", "draft-bogus"])


def test_projector_options():
    f = _parse("-mm p.gguf -mmdev RPC0 --image-max-tokens 256")
    mm = f.mmproj
    assert (mm.path, mm.use_gpu, mm.device, mm.image_max_tokens) == ("p.gguf", True, "RPC0", 256)
    off = parse_llama_flags(["-mm", "p.gguf", "-mmdev", "none"]).mmproj
    assert (off.use_gpu, off.device) == (False, None)
    assert parse_llama_flags(["-mm", "p.gguf", "--no-mmproj-offload"]).mmproj.use_gpu is False
    with pytest.raises(FlagError, match="only one device"):
        parse_llama_flags(["-mmdev", "RPC0,RPC1"])


def test_lora_lists_and_scales():
    f = _parse("--lora a.gguf,b.gguf --lora-scaled c.gguf:0.5")
    assert f.loras == (LoraArg("a.gguf"), LoraArg("b.gguf"), LoraArg("c.gguf", 0.5))
    with pytest.raises(FlagError, match="FNAME:SCALE"):
        parse_llama_flags(["--lora-scaled", "c.gguf"])


def test_companion_flags_round_trip():
    f = _parse("-c 8192 -md d.gguf -devd RPC1 -ngld 20 -otd x=CPU -cmoed -ctkd q8_0 --spec-draft-n-max 5 "
               "--spec-type draft-simple -mm p.gguf --no-mmproj-offload --lora a.gguf --lora-scaled b.gguf:0.25")
    assert f.has_companions
    assert parse_llama_flags(flags_to_argv(f)) == f


def test_drafter_inherits_the_target_and_takes_its_context():
    # common_base_params_to_speculative + common_speculative_init_result (cparams.n_ctx = llama_n_ctx(ctx_tgt))
    target = _parse("-c 0 -np 2 -ub 256 -ts 3,1 -ngl 9 -ctk q8_0 -fa on -md d.gguf -ctkd f16")
    d = draft_flags(target, 131072)
    assert (d.n_ctx, d.n_parallel, d.n_ubatch, d.tensor_split, d.flash_attn) == (131072, 2, 256, (3.0, 1.0), "on")
    assert (d.n_gpu_layers, d.cache_type_k, d.has_companions) == (-1, "f16", False)
    # one -devd device: split by layer even under -sm tensor
    assert draft_flags(_parse("-sm tensor -md d.gguf -devd RPC1"), 4096).split_mode == "layer"
    assert draft_flags(parse_llama_flags(["-sm", "tensor", "-md", "d.gguf"]), 4096).split_mode == "tensor"


def test_server_output_rows():
    # server_output_limits: -np x (1 + longest proposal), at most -b, at least 1
    assert server_outputs_max(2048, 1) == 1
    assert server_target_outputs_max(_parse("-np 4 --spec-type draft-simple -md d.gguf")) == 16
    assert server_target_outputs_max(_parse("-b 8 -np 4 --spec-type ngram-mod")) == 8


def test_rpc_endpoints_are_host_and_port():
    # ggml-rpc.cpp parse_endpoint: HOST:PORT, else the server is not added; a hostile endpoint is not echoed whole
    assert parse_llama_flags(["--rpc", "127.0.0.1:50052,[::1]:50053"]).rpc == ("127.0.0.1:50052", "[::1]:50053")
    for bad in ("a" * 5000, "host", "host:", "host:0", "host:70000", ":50052", "host:٥٠"):
        with pytest.raises(FlagError, match="HOST:PORT") as e:
            parse_llama_flags(["--rpc", bad])
        assert len(str(e.value)) < 200
