"""Issue #22: llama.cpp flags that hang fitplan or exhaust its memory (and would hang llama.cpp's
std::regex too) are refused at parse in one line; -ncmoe/-ncffn of 10^8 layers cost what the model's
layers cost."""
from __future__ import annotations

import time

import pytest

from planner.core.errors import FlagError
from planner.llama.flags import LLAMA_MAX_LAYERS, parse_llama_flags
from planner.llama.override_regex import MAX_GROUP_DEPTH, check_override_pattern


@pytest.mark.parametrize("flag", ["-ncmoe", "-ncffn", "-ncmoed"])
def test_a_hundred_million_cpu_layers_is_cheap(flag):
    started = time.monotonic()
    flags = parse_llama_flags([flag, "100000000"])
    overrides = flags.overrides if flag != "-ncmoed" else flags.spec.draft.overrides
    # llama.cpp adds one override per layer; those past LLAMA_MAX_LAYERS match no tensor
    assert len(overrides) == LLAMA_MAX_LAYERS and time.monotonic() - started < 2
    assert overrides[-1].pattern.startswith(rf"blk\.{LLAMA_MAX_LAYERS - 1}\.")


@pytest.mark.parametrize("value", ["10000000000", "9" * 5000, "٣", "1.5", ""])
def test_integers_are_what_std_stoi_reads(value):
    with pytest.raises(FlagError, match="expected an integer"):
        parse_llama_flags(["-ncmoe", value])


def test_5000_nested_groups_are_refused_not_a_recursion_error():
    with pytest.raises(FlagError, match="characters; expected at most"):
        parse_llama_flags(["-ot", "(" * 5000 + "x" + ")" * 5000 + "=CPU"])
    with pytest.raises(FlagError, match=f"nested 1000 deep.*expected at most {MAX_GROUP_DEPTH}"):
        parse_llama_flags(["-ot", "(" * 1000 + "x" + ")" * 1000 + "=CPU"])
    assert check_override_pattern("(" * MAX_GROUP_DEPTH + "x" + ")" * MAX_GROUP_DEPTH)


@pytest.mark.parametrize("pattern", ["(.*)*x", "(a+)+$", "(x|.+)*y", "((ab)*c+)*z", "(?:.*_)*END"])
def test_nested_quantifiers_are_refused_and_say_llama_cpp_would_hang(pattern):
    started = time.monotonic()
    with pytest.raises(FlagError, match="nested quantifier.*llama.cpp's std::regex backtracks"):
        parse_llama_flags(["-ot", f"{pattern}=CPU"])
    assert time.monotonic() - started < 2


def test_a_pattern_slow_on_one_tensor_name_is_refused():
    started = time.monotonic()
    with pytest.raises(FlagError, match="catastrophic backtracking.*would hang"):
        parse_llama_flags(["-ot", ".*.*.*.*.*.*.*.*y=CPU"])
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("pattern", [r"blk\.(1[0-9]|2[0-9])\.ffn_.*_exps=CPU", r"\.ffn_(up|down)_exps\.=CPU",
                                     r"blk\.[0-9]+\.ffn_(up|gate)\.weight=CPU", r"^token_embd\.weight=CPU",
                                     r"(blk\.[0-9]\.)?attn_.?=CPU"])
def test_ordinary_patterns_still_parse(pattern):
    assert parse_llama_flags(["-ot", pattern]).overrides


def test_a_future_warning_pattern_is_quiet(recwarn):
    parse_llama_flags(["-ot", "[[a]=CPU"])
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_tensor_split_takes_ascii_digits_only():
    with pytest.raises(FlagError, match="-ts"):
        parse_llama_flags(["-ts", "٣,1"])


@pytest.mark.parametrize("value", ["nan,1", "inf", "1,-inf", "-1,1"])
def test_tensor_split_takes_finite_proportions_only(value):
    # -ts nan,1 reached numpy's split arithmetic ("invalid value encountered in divide" on stderr)
    with pytest.raises(FlagError, match="expected finite proportions >= 0"):
        parse_llama_flags(["-ts", value])
    assert parse_llama_flags(["-ts", "3,1"]).tensor_split == (3.0, 1.0)


def test_parallel_is_bounded_by_llama_max_seq():
    # -np 1000000 reached the graph builder (ZeroDivisionError in _can_repeat); llama.cpp refuses it
    with pytest.raises(FlagError, match="n_seq_max must be <= 256"):
        parse_llama_flags(["-np", "1000000"])
    assert parse_llama_flags(["-np", "256"]).n_parallel == 256
