"""--backend / --params-backend / --max-vram syntax: every rule and example of seed 002."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.sd.assign import Module, Role, parse_assignment, parse_max_vram, parse_module

ALL = list(Module)


def test_bare_value_applies_to_every_module():
    # seed 002: sd-cli ... --backend cpu
    a = parse_assignment("cpu", Role.BACKEND)
    assert [a.get(m) for m in ALL] == ["cpu"] * len(ALL)


def test_per_module_assignment_example():
    # seed 002: --backend te=cpu,vae=cuda0,diffusion=vulkan0
    a = parse_assignment("te=cpu,vae=cuda0,diffusion=vulkan0", Role.BACKEND)
    assert (a.get(Module.TE), a.get(Module.VAE), a.get(Module.DIFFUSION)) == ("cpu", "cuda0", "vulkan0")
    assert a.get(Module.CONTROLNET) == ""  # unassigned: the default backend
    assert not a.explicit(Module.CONTROLNET)


def test_params_backend_example():
    # seed 002: --backend cuda0 --params-backend te=cpu,vae=cpu
    p = parse_assignment("te=cpu,vae=cpu", Role.PARAMS)
    assert (p.get(Module.TE), p.get(Module.VAE), p.get(Module.DIFFUSION)) == ("cpu", "cpu", "")


def test_params_backend_accepts_disk():
    # seed 002: --backend cuda0 --params-backend disk
    assert parse_assignment("disk", Role.PARAMS).get(Module.DIFFUSION) == "disk"
    assert parse_assignment("diffusion=disk", Role.PARAMS).get(Module.DIFFUSION) == "disk"


@pytest.mark.parametrize("text", ["disk", "DISK", "vae=disk", "all=disk", "diffusion=cuda0&disk"])
def test_backend_refuses_disk(text):
    # seed 002: "--backend disk is invalid because disk is a parameter residency mode"
    with pytest.raises(FlagError, match=r"--backend.*'disk'"):
        parse_assignment(text, Role.BACKEND)


# The seed's "Modules" table, typed out from the seed (not from the code under test).
SEED_ALIASES = [
    ("diffusion", Module.DIFFUSION), ("model", Module.DIFFUSION), ("unet", Module.DIFFUSION), ("dit", Module.DIFFUSION),
    ("te", Module.TE), ("clip", Module.TE), ("text", Module.TE), ("textencoder", Module.TE),
    ("textencoders", Module.TE), ("conditioner", Module.TE), ("cond", Module.TE), ("llm", Module.TE),
    ("t5", Module.TE), ("t5xxl", Module.TE),
    ("clip_vision", Module.CLIP_VISION), ("clipvision", Module.CLIP_VISION), ("clip-vision", Module.CLIP_VISION),
    ("vision", Module.CLIP_VISION),
    ("vae", Module.VAE), ("firststage", Module.VAE), ("autoencoder", Module.VAE), ("tae", Module.VAE),
    ("controlnet", Module.CONTROLNET), ("control", Module.CONTROLNET),
    ("photomaker", Module.PHOTOMAKER), ("photomakerid", Module.PHOTOMAKER), ("pmid", Module.PHOTOMAKER),
    ("photo", Module.PHOTOMAKER),
    ("upscaler", Module.UPSCALER), ("esrgan", Module.UPSCALER), ("hires", Module.UPSCALER),
    ("detector", Module.DETECTOR), ("adetailer", Module.DETECTOR), ("yolo", Module.DETECTOR),
]


@pytest.mark.parametrize("alias,module", SEED_ALIASES)
def test_every_seed_alias(alias, module):
    a = parse_assignment(f"{alias}=cuda0", Role.BACKEND)
    assert a.get(module) == "cuda0"
    assert [m for m in ALL if a.get(m)] == [module]


@pytest.mark.parametrize("spelling", ["clip_vision", "clip-vision", "clipvision", "CLIP_Vision", "Clip-VISION",
                                      "clip__vision", "text_encoder", "Text-Encoders", "T5XXL", "first_stage"])
def test_module_names_case_insensitive_ignoring_hyphen_underscore(spelling):
    assert parse_module(spelling) is not None


def test_equivalent_spellings_name_the_same_module():
    assert (parse_module("clip_vision") is parse_module("clip-vision") is parse_module("clipvision")
            is Module.CLIP_VISION)
    assert parse_module("first_stage") is Module.VAE


@pytest.mark.parametrize("key", ["all", "default", "*", "ALL", "Default"])
def test_default_keys_inside_mixed_assignment(key):
    # seed 002: --backend all=cuda0,te=cpu
    a = parse_assignment(f"{key}=cuda0,te=cpu", Role.BACKEND)
    assert a.get(Module.TE) == "cpu"
    assert a.get(Module.DIFFUSION) == a.get(Module.VAE) == "cuda0"


def test_module_setting_wins_regardless_of_position():
    a = parse_assignment("te=cpu,all=cuda0", Role.BACKEND)
    assert a.get(Module.TE) == "cpu" and a.get(Module.VAE) == "cuda0"


def test_last_setting_for_a_module_wins():
    a = parse_assignment("te=cpu,clip=cuda1,cuda0,vulkan0", Role.BACKEND)
    assert a.get(Module.TE) == "cuda1"
    assert a.default == "vulkan0"


def test_empty_parts_and_whitespace_are_ignored():
    a = parse_assignment(" te = cpu ,, vae=cuda0 , ", Role.BACKEND)
    assert (a.get(Module.TE), a.get(Module.VAE)) == ("cpu", "cuda0")
    assert parse_assignment("", Role.BACKEND).empty
    assert parse_assignment(None, Role.PARAMS).empty


def test_device_list_in_backend():
    # seed 002: --backend "diffusion=cuda0&cuda1"
    assert parse_assignment("diffusion=cuda0&cuda1", Role.BACKEND).get(Module.DIFFUSION) == "cuda0&cuda1"
    # seed 002 (row split): --backend "diffusion=cuda0&cuda1,te=cuda0&cuda1"
    a = parse_assignment("diffusion=cuda0&cuda1,te=cuda0&cuda1", Role.BACKEND)
    assert a.get(Module.TE) == "cuda0&cuda1"


@pytest.mark.parametrize("text", ["te=cuda0&cuda1", "cuda0&cuda1", "all=cuda0&cpu"])
def test_params_backend_refuses_device_lists(text):
    # seed 002: "--params-backend accepts no device lists"
    with pytest.raises(FlagError, match=r"--params-backend.*device lists"):
        parse_assignment(text, Role.PARAMS)


@pytest.mark.parametrize("text", ["diffusion=auto&cuda0", "diffusion=cuda0&default"])
def test_default_token_not_allowed_in_a_device_list(text):
    with pytest.raises(FlagError, match="not allowed in a device list"):
        parse_assignment(text, Role.BACKEND)


def test_only_ampersands_is_an_invalid_list():
    with pytest.raises(FlagError, match="invalid backend device list"):
        parse_assignment("diffusion=&&", Role.BACKEND)


@pytest.mark.parametrize("role", [Role.BACKEND, Role.PARAMS])
@pytest.mark.parametrize("part", ["vae=", "=cuda0", " = "])
def test_empty_key_or_value_refused_naming_the_part(role, part):
    with pytest.raises(FlagError, match="invalid backend assignment") as e:
        parse_assignment(f"te=cpu,{part}", role)
    assert repr(part.strip()) in str(e.value)


@pytest.mark.parametrize("role", [Role.BACKEND, Role.PARAMS])
def test_unknown_module_refused_naming_it(role):
    with pytest.raises(FlagError, match=r"unknown backend module 'foo'"):
        parse_assignment("foo=cuda0", role)


def test_offload_to_cpu_prepends_a_cpu_default():
    # seed 002: --offload-to-cpu --params-backend te=disk == --params-backend '*=cpu,te=disk'
    p = parse_assignment("*=cpu,te=disk", Role.PARAMS)
    assert p.get(Module.TE) == "disk" and p.get(Module.DIFFUSION) == p.get(Module.VAE) == "cpu"


def test_clip_on_cpu_prepends_te_cpu():
    # seed 002: --clip-on-cpu prepends te=cpu to --backend; a later te= overrides it
    assert parse_assignment("te=cpu,cuda0", Role.BACKEND).get(Module.TE) == "cpu"
    assert parse_assignment("te=cpu,te=cuda1", Role.BACKEND).get(Module.TE) == "cuda1"


def test_max_vram_example():
    # seed 002: --max-vram cuda0=6,vulkan0=2
    mv = parse_max_vram("cuda0=6,vulkan0=2")
    assert mv.devices == (("cuda0", 6.0), ("vulkan0", 2.0))
    assert mv.default_gib == 0.0


@pytest.mark.parametrize("text,default", [("6", 6.0), ("-2", -2.0), ("all=4", 4.0), ("*=1.5", 1.5), ("", 0.0)])
def test_max_vram_default_forms(text, default):
    assert parse_max_vram(text).default_gib == default


@pytest.mark.parametrize("text,token", [("cuda0=", "cuda0="), ("=6", "=6"), ("cuda0=six", "six"),
                                        ("lots", "lots"), ("cuda0=nan", "nan"), ("inf", "inf")])
def test_max_vram_malformed(text, token):
    with pytest.raises(FlagError, match="--max-vram") as e:
        parse_max_vram(text)
    assert repr(token) in str(e.value)


def test_compat_flags_prepend_their_entries():
    from planner.sd.assign import with_compat

    assert with_compat("cuda0", Role.BACKEND, ("--clip-on-cpu", "--vae-on-cpu")) == "te=cpu,vae=cpu,cuda0"
    assert with_compat(None, Role.BACKEND, ("--control-net-cpu",)) == "controlnet=cpu"
    assert with_compat("te=disk", Role.PARAMS, ("--offload-to-cpu", "--clip-on-cpu")) == "*=cpu,te=disk"
    assert with_compat("te=disk", Role.PARAMS, ()) == "te=disk"
    with pytest.raises(FlagError):
        with_compat("", Role.BACKEND, ("--gpu-on-fire",))


def test_split_mode_syntax():
    a = parse_assignment("layer,diffusion=ROW", Role.SPLIT_MODE)
    assert (a.get(Module.TE), a.get(Module.DIFFUSION)) == ("layer", "ROW")
    with pytest.raises(FlagError, match=r"invalid split mode 'column'"):
        parse_assignment("te=column", Role.SPLIT_MODE)
