"""Issue #22: sd-fit refuses a device list on a module stable-diffusion.cpp cannot layer-split (seed 002)."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.sd.assign import SPLITTABLE, Module, Role, parse_assignment


@pytest.mark.parametrize("module", ["vae", "clip_vision", "controlnet", "photomaker", "upscaler", "detector",
                                    "first_stage", "tae"])
def test_a_device_list_on_a_module_that_cannot_split_is_refused_with_the_rule(module):
    with pytest.raises(FlagError, match="cannot be split over devices; layer split is supported for the diffusion "
                                        "and te modules only.*seed 002"):
        parse_assignment(f"{module}=cuda0&cuda1", Role.BACKEND)


def test_diffusion_and_te_still_split():
    assert {Module.DIFFUSION, Module.TE} == SPLITTABLE
    parsed = parse_assignment("diffusion=cuda0&cuda1,te=cuda0&cuda1,vae=cuda1", Role.BACKEND)
    assert parsed.get(Module.DIFFUSION) == "cuda0&cuda1" and parsed.get(Module.VAE) == "cuda1"
