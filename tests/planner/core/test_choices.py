"""planner.core.choices: an option's values as one enum, read in any case, refused in one line."""
from __future__ import annotations

import pytest

from planner.core.choices import Engine, Objective, OptionEnum, Program, SplitMode
from planner.core.errors import BadInput


def test_a_value_is_read_in_any_case_and_with_blanks():
    assert Objective("Context") is Objective.CONTEXT
    assert Objective(" balance ") is Objective.BALANCE
    assert Engine("LLAMA.CPP") is Engine.LLAMA_CPP
    assert Program(Program.SERVER) is Program.SERVER


def test_an_unknown_value_names_the_option_and_every_choice():
    with pytest.raises(BadInput) as refused:
        SplitMode("row")
    assert str(refused.value) == "--split-mode 'row': expected auto | layer"
    assert not isinstance(refused.value, ValueError)   # typer would wrap a ValueError in its own words


def test_a_member_prints_as_its_value():
    assert str(Objective.THROUGHPUT) == "throughput" and f"{Engine.LLAMA_CPP}" == "llama.cpp"
    assert Objective.THROUGHPUT == "throughput"


def test_every_option_enum_names_its_option():
    for enum in OptionEnum.__subclasses__():
        assert enum.__option__.startswith("--"), enum
