"""Synthetic safetensors files for the sd planner tests (planner/synth/safetensors_factory.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.synth.safetensors_factory import write_safetensors


@pytest.fixture
def st_file(tmp_path):
    def make(name: str, tensors: dict[str, tuple[str, list[int]]]) -> Path:
        return write_safetensors(tmp_path / name, tensors)

    return make
