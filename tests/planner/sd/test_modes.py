"""--flash-attn / --conv-direct: syntax, precedence and auto rules of seed 002."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.sd.modes import Feature, Switch, decide, legacy_modes, parse_modes

FA, CD = Feature.FLASH_ATTN, Feature.CONV_DIRECT
CPU = ()
CUDA = (("CUDA", "NVIDIA GeForce RTX 4090"),)


def test_default_is_auto_and_a_bare_mode_sets_it():
    assert parse_modes(None, FA).of("diffusion") is Switch.AUTO
    assert parse_modes("", FA).of("te") is Switch.AUTO
    assert parse_modes("off", FA).of("vae") is Switch.OFF


def test_module_settings_win_regardless_of_position():
    # seed: "module-specific settings take precedence regardless of their position"
    spec = parse_modes("te=off,on", FA)
    assert spec.of("te") is Switch.OFF and spec.of("diffusion") is Switch.ON


def test_last_setting_for_a_key_wins_and_aliases_resolve():
    spec = parse_modes("auto,clip=on,text=off,all=off,*=on", FA)
    assert spec.of("te") is Switch.OFF          # clip and text are both te: the later wins
    assert spec.default is Switch.ON            # all= then *=: the later wins


@pytest.mark.parametrize("text,feature", [("te=on", CD), ("clip_vision=off", CD), ("upscaler=on", FA),
                                          ("diffusion=fast", FA), ("nonsense=on", FA), ("maybe", CD)])
def test_rejected(text, feature):
    with pytest.raises(FlagError):
        parse_modes(text, feature)


def test_audio_encoder_is_a_flash_attention_module():
    assert parse_modes("off,audio_encoder=on", FA).of("audio_encoder") is Switch.ON


@pytest.mark.parametrize("feature,kwargs,expected", [
    (FA, {"all_on": True}, "on"),
    (FA, {"diffusion_on": True}, "off,diffusion=on"),
    (CD, {"diffusion_on": True}, "auto,diffusion=on,controlnet=on"),
    (CD, {"vae_on": True}, "auto,vae=on"),
    (CD, {"diffusion_on": True, "vae_on": True}, "auto,diffusion=on,controlnet=on,vae=on"),
    (FA, {}, None),
])
def test_legacy_switches(feature, kwargs, expected):
    assert legacy_modes(None, feature, **kwargs) == expected


def test_explicit_mode_string_beats_legacy_switches():
    assert legacy_modes("off", FA, all_on=True) == "off"


@pytest.mark.parametrize("devices,fa,cd", [
    (CPU, True, False),                                        # CPU: FA on without timing, conv off
    (CUDA, True, True),                                        # CUDA: MMA FA and implicit-GEMM conv
    ((("Vulkan", "NVIDIA GeForce RTX 3060"),), True, False),   # RTX by name skips the FA benchmark
    ((("Vulkan", "NVIDIA RTX A6000"),), True, False),
    ((("Vulkan", "AMD Radeon RX 7900 XTX"),), False, False),   # benchmarked: planned as off
    ((("Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)"),), False, False),
    ((("ROCm", "gfx1100"),), False, False),
    ((("Metal", "Apple M2"),), False, False),
    ((("CUDA", "RTX 4090"), ("Vulkan", "AMD Radeon")), False, False),   # every device must say on
])
def test_auto_per_backend(devices, fa, cd):
    assert decide(parse_modes("auto", FA), "diffusion", devices) is fa
    assert decide(parse_modes("auto", CD), "diffusion", devices) is cd


def test_explicit_on_off_ignore_the_backend():
    assert decide(parse_modes("on", FA), "vae", (("Metal", "Apple M2"),)) is True
    assert decide(parse_modes("off", CD), "vae", CUDA) is False
    # one module's explicit setting does not change another's auto
    spec = parse_modes("te=off", FA)
    assert decide(spec, "te", CPU) is False and decide(spec, "diffusion", CPU) is True
