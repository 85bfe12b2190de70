"""The pinned llama.cpp's own name lists, committed as data (planner/gguf/data, written by
scripts/pin_lists.py from the sdist): the architectures of src/llama-arch.cpp LLM_ARCH_NAMES and the
projector types of tools/mtmd/clip-impl.h PROJECTOR_TYPE_NAMES, in the pin's order."""
from __future__ import annotations

from functools import cache
from importlib import resources

ARCHITECTURES_FILE = "pin_architectures.txt"
PROJECTORS_FILE = "pin_projectors.txt"


@cache
def _read(name: str) -> tuple[str, tuple[str, ...]]:
    text = resources.files("planner.gguf").joinpath("data").joinpath(name).read_text(encoding="utf-8")
    lines = text.splitlines()
    return lines[0].lstrip("# "), tuple(line.strip() for line in lines[1:] if line.strip())


def pin_architectures() -> tuple[str, ...]:
    """Every architecture name the pinned llama.cpp loads a model for."""
    return _read(ARCHITECTURES_FILE)[1]


def pin_projectors() -> tuple[str, ...]:
    """Every projector type name the pinned llama.cpp's mtmd knows."""
    return _read(PROJECTORS_FILE)[1]


def source(name: str) -> str:
    """The header line of a list: the file, table and commit it was extracted from."""
    return _read(name)[0]
