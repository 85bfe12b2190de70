"""Fixtures the sd-fit CLI tests share."""
from __future__ import annotations

import pytest

from planner.synth.shapes_sd import write_checkpoint


@pytest.fixture(scope="session")
def sd15(tmp_path_factory) -> str:
    """The shape-faithful SD 1.5 checkpoint (sparse safetensors), written once per run."""
    return str(write_checkpoint("sd15", tmp_path_factory.mktemp("sd") / "sd15.safetensors"))
