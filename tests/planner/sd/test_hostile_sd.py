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


@pytest.mark.parametrize("text", ["cuda0=٨", "٦"])
def test_sd_max_vram_refuses_non_ascii_digits(text):
    from planner.sd.assign import parse_max_vram

    with pytest.raises(FlagError, match="--max-vram"):
        parse_max_vram(text)
    assert parse_max_vram(None).default_gib == 0 and parse_max_vram("cuda0=6").devices == (("cuda0", 6.0),)
