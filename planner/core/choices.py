"""The closed vocabularies a user picks from: the command line's option values and the API's
keywords, one enum each. The command line declares its options with them (and loads nothing
heavier than this file to do so); the library takes a member or its value.

Looking a member up by a value it does not have raises BadInput naming the option and the
choices (`--objective 'fastest': expected throughput | context | balance`), never a bare
ValueError: the one place a choice is checked, for the command line and the API alike. Values
match in any case and with surrounding blanks.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from planner.core.errors import BadInput


class OptionEnum(str, Enum):
    """A closed set of option values. `__option__` names the option in the refusal; a member prints
    as its value."""

    __option__ = "value"

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def choices(cls) -> str:
        return " | ".join(m.value for m in cls)

    @classmethod
    def _missing_(cls, value: Any) -> OptionEnum:
        text = str(value).strip().lower()
        for member in cls:
            if member.value == text:
                return member
        raise BadInput(f"{cls.__option__} {value!r}: expected {cls.choices()}")


class Objective(OptionEnum):
    """What `plan` optimises."""

    __option__ = "--objective"
    THROUGHPUT = "throughput"   # fastest predicted decode at the requested context
    CONTEXT = "context"         # the largest context, then the fastest
    BALANCE = "balance"         # the smallest largest utilisation, then the fastest


class Solver(OptionEnum):
    __option__ = "--solver"
    DP = "dp"       # solve_dp: exact over contiguous ranges, milliseconds
    MILP = "milp"   # solve_milp: PuLP, exact for unequal expert sizes, slow on large instances


class OpOffload(OptionEnum):
    """llama.cpp's op offload (--op-offload / --no-op-offload), or the planner's choice."""

    __option__ = "--op-offload"
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class SplitMode(OptionEnum):
    """`plan`'s and `choose`'s split: -sm tensor where it decodes faster than the layer split, or never."""

    __option__ = "--split-mode"
    AUTO = "auto"
    LAYER = "layer"


class Program(OptionEnum):
    """Whose allocation `estimate` predicts."""

    __option__ = "--program"
    FIT_PARAMS = "fit-params"   # llama-fit-params --fit-print on: the dry run (no_alloc)
    SERVER = "server"           # llama-server (and llama-cli): a real load, its own output rows


class SweepMode(OptionEnum):
    """How `sweep` evaluates each point."""

    __option__ = "--mode"
    ESTIMATE = "estimate"   # the flags as given, estimated at each point
    PLAN = "plan"           # the planner's best placement at each point


class Engine(OptionEnum):
    """What `validate` runs the model in."""

    __option__ = "--engine"
    EMBEDDED = "embedded"     # the runtime's scheduler, allocator and kernels
    LLAMA_CPP = "llama.cpp"   # the pinned llama.cpp tools on loopback
