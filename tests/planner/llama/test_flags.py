"""llama.cpp flag parsing: defaults and spellings from common/arg.cpp / common.h of the pinned build."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.llama.flags import (
    NGL_ALL,
    NGL_AUTO,
    LlamaFlags,
    OverrideArg,
    TensorOverride,
    flags_to_argv,
    parse_llama_flags,
)


def test_defaults_are_llama_cpp_defaults():
    f = parse_llama_flags([])
    # common.h: n_ctx 0 (training context), n_batch 2048, n_ubatch 512, n_parallel 1, ngl -1 (auto)
    assert (f.n_ctx, f.n_batch, f.n_ubatch, f.n_parallel) == (0, 2048, 512, 1)
    assert f.n_gpu_layers == NGL_AUTO and f.n_gpu_layers_all
    assert (f.split_mode, f.flash_attn, f.cache_type_k, f.cache_type_v) == ("layer", "auto", "f16", "f16")
    assert f.kv_offload and not f.kv_unified and not f.swa_full and f.repack
    assert f.overrides == () and f.tensor_split == () and f.devices is None


def test_short_and_long_spellings():
    f = parse_llama_flags(["--ctx-size", "8192", "-b", "1024", "--ubatch-size", "128", "--parallel", "4",
                           "--n-gpu-layers", "20", "-ctk", "Q8_0", "--cache-type-v=q8_0", "-fa", "off", "-kvu",
                           "--swa-full", "-nkvo", "--no-repack"])
    assert (f.n_ctx, f.n_batch, f.n_ubatch, f.n_parallel, f.n_gpu_layers) == (8192, 1024, 128, 4, 20)
    assert (f.cache_type_k, f.cache_type_v, f.flash_attn) == ("q8_0", "q8_0", "off")
    assert f.kv_unified and f.swa_full and not f.kv_offload and not f.repack


@pytest.mark.parametrize("value, expected", [("all", NGL_ALL), ("auto", NGL_AUTO), ("0", 0), ("99", 99)])
def test_ngl_values(value, expected):
    assert parse_llama_flags(["-ngl", value]).n_gpu_layers == expected


@pytest.mark.parametrize("text, expected", [("3,1", (3.0, 1.0)), ("3/1", (3.0, 1.0)), ("0.7,0.3", (0.7, 0.3)),
                                            ("1,,2", (1.0, 2.0)), ("20/12", (20.0, 12.0))])
def test_tensor_split_separators(text, expected):
    # arg.cpp splits -ts on the regex [,/]+
    assert parse_llama_flags(["-ts", text]).tensor_split == expected


def test_fa_truthy_and_falsey_words():
    assert parse_llama_flags(["-fa", "1"]).flash_attn == "on"
    assert parse_llama_flags(["-fa", "disabled"]).flash_attn == "off"


def test_overrides_keep_command_line_order():
    f = parse_llama_flags(["-ot", r"exps=CPU,blk\.0\.=RPC0", "-ncmoe", "2", "-cmoe", "-ot", "output=CPU"])
    exps = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"   # common.h LLM_FFN_EXPS_REGEX
    assert f.overrides == (
        TensorOverride("exps", "CPU"), TensorOverride(r"blk\.0\.", "RPC0"),
        TensorOverride(r"blk\.0" + exps, "CPU"), TensorOverride(r"blk\.1" + exps, "CPU"),
        TensorOverride(exps, "CPU"), TensorOverride("output", "CPU"))


def test_ncmoe_zero_adds_no_override():
    assert parse_llama_flags(["-ncmoe", "0"]).overrides == ()


def test_rpc_lists_accumulate():
    f = parse_llama_flags(["--rpc", "127.0.0.1:5000,127.0.0.1:5001", "--rpc", "10.0.0.2:50052"])
    assert f.rpc == ("127.0.0.1:5000", "127.0.0.1:5001", "10.0.0.2:50052")


def test_ignored_flags_are_listed_with_their_values():
    f = parse_llama_flags(["-t", "8", "--temp", "0.7", "-c", "512", "--no-warmup"])
    assert f.ignored == ("-t", "8", "--temp", "0.7", "--no-warmup")
    assert f.n_ctx == 512


@pytest.mark.parametrize("argv, words", [
    (["--bogus"], "unknown llama.cpp flag '--bogus'"),
    (["-c"], "-c: expected a value"),
    (["-c", "big"], "expected an integer"),
    (["-c", "-5"], "out of range"),
    (["-np", "0"], "out of range"),
    (["-ncmoe", "-1"], "out of range"),
    (["-ctk", "q3_k"], "unsupported cache type"),
    (["-fa", "maybe"], "invalid value"),
    (["-sm", "columns"], "invalid value"),
    (["-ot", "exps"], "is not PATTERN=BUFFER_TYPE"),
    (["-ot", "(=CPU"], "bad regular expression"),
    (["-ts", ",".join(["1"] * 16)], "at most 15"),
])
def test_refused_like_llama_cpp(argv, words):
    with pytest.raises(FlagError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_llama_flags(argv)


@pytest.mark.parametrize("argv", [
    [],
    ["-c", "32768", "-ngl", "all", "-ts", "3,1", "--rpc", "a:1,b:2", "-ot", "exps=CPU", "-ncmoe", "3"],
    ["-ngl", "12", "-sm", "none", "-mg", "1", "-dev", "CUDA1,CUDA0", "-np", "4", "-kvu", "-fa", "off",
     "-ctk", "q8_0", "--swa-full", "-nkvo", "-nr", "--no-host", "-b", "512", "-ub", "128", "-cmoe"],
    ["-ts", "0.7/0.3", "-lm", "none", "-t", "4"],
])
def test_round_trip(argv):
    f = parse_llama_flags(argv)
    assert parse_llama_flags(flags_to_argv(f)) == f


def test_flags_to_argv_leaves_defaults_out():
    assert flags_to_argv(LlamaFlags()) == []
    assert flags_to_argv(LlamaFlags(n_ctx=4096, override_args=(OverrideArg("cmoe"),))) == ["-c", "4096", "-cmoe"]
