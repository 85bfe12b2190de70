"""sd-cli flags read from an argument vector (planner/sd/argv.py): the base flags a `res` sweep
takes after `--`."""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.sd.argv import request_from_argv
from planner.sd.roles import FileRole


def test_files_values_and_switches():
    r = request_from_argv([], ["--diffusion-model", "dit.gguf", "--vae", "ae.safetensors", "--backend", "cuda0",
                               "--max-vram", "6", "--auto-fit", "off", "--steps", "4", "--vae-tiling", "--mmap",
                               "--offload-to-cpu"])
    assert [(s.path, s.role) for s in r.sources] == [("dit.gguf", FileRole.DIFFUSION_MODEL),
                                                     ("ae.safetensors", FileRole.VAE)]
    assert (r.backend, r.max_vram, r.auto_fit, r.steps, r.vae_tiling, r.mmap) == ("cuda0", "6", False, 4, True, True)
    assert r.compat == ("--offload-to-cpu",)


def test_flash_attention_last_occurrence_and_conv_direct_legacy():
    # seed 002: the last of --flash-attn, --fa, --diffusion-fa wins; an explicit --conv-direct wins
    # over --diffusion-conv-direct / --vae-conv-direct in any order
    assert request_from_argv(["m"], ["--flash-attn", "off", "--fa"]).flash_attn == "on"
    assert request_from_argv(["m"], ["--fa", "--flash-attn", "off"]).flash_attn == "off"
    assert request_from_argv(["m"], ["--vae-conv-direct"]).conv_direct == "auto,vae=on"
    assert request_from_argv(["m"], ["--conv-direct", "off", "--vae-conv-direct"]).conv_direct == "off"


@pytest.mark.parametrize("argv,needle", [(["--bogus", "1"], "'--bogus'"), (["--steps"], "expected a value"),
                                         (["--steps", "x"], "whole number"), (["--auto-fit", "maybe"], "--auto-fit")])
def test_bad_flags(argv, needle):
    with pytest.raises(FlagError, match=needle):
        request_from_argv(["m"], argv)


def test_no_model():
    with pytest.raises(FlagError, match="no model"):
        request_from_argv([], ["--backend", "cpu"])


def test_batch_count_in_sd_clis_spellings():
    assert request_from_argv(["m"], []).batch == 1
    assert request_from_argv(["m"], ["-b", "4"]).batch == request_from_argv(["m"], ["--batch-count", "4"]).batch == 4
    with pytest.raises(FlagError, match="-b 'x': expected a whole number"):
        request_from_argv(["m"], ["-b", "x"])
