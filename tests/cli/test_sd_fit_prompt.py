"""`fitplan sd-fit --prompt-tokens N` on the shape-faithful SD 1.5 checkpoint: CLIP cuts a prompt past 75
tokens into 77-token chunks and the UNet attends over all of them (runtime/sd/clip_text.py
`context_tokens`), so the UNet's compute figure is the one sd-cli logged for a prompt of N tokens (the
corpus's `prompt_tokens` rows, at the 0.01 MB sd-cli prints), CLIP's stays one chunk's, and the JSON
states the tokens assumed."""
from __future__ import annotations

import pytest

from planner.cli import main
from planner.sd.sd_compute import corpus
from tests.support.sd_corpus import logged
from tests.support.sd_fit import sd_fit_json as plan

CPU = ["--backend", "cpu", "--ram", "64GiB", "--flash-attn", "on", "--conv-direct", "off", "-W", "320", "-H", "448"]


def test_a_long_prompt_grows_the_unet_as_sd_cli_logged(capsys, sd15):
    short = plan(capsys, sd15, *CPU)
    long = plan(capsys, sd15, *CPU, "--prompt-tokens", "120")
    recorded = {r.runner: logged(r.bytes) for r in corpus()
                if r.family == "sd15" and r.prompt_tokens == 120 and (r.width, r.height) == (320, 448)}
    got = {c["module"]: logged(c["compute_reserve_bytes"]) for c in long["components"]}
    assert {k: got[k] for k in ("diffusion", "te")} == {"diffusion": recorded["unet"], "te": recorded["clip"]}
    before = {c["module"]: c["compute_reserve_bytes"] for c in short["components"]}
    assert got["te"] == logged(before["te"]) and float(got["diffusion"]) > float(logged(before["diffusion"]))
    assert short["prompt"] == {"tokens": None, "sized_by_length": True}
    assert long["prompt"] == {"tokens": 120, "sized_by_length": True}
    # 75 tokens and BOS/EOS fill the one chunk a short prompt has
    assert plan(capsys, sd15, *CPU, "--prompt-tokens", "75")["components"] == short["components"]
    assert main(["sd-fit", sd15, *CPU, "--prompt-tokens", "120"]) == 0
    out, _ = capsys.readouterr()
    assert "prompt of 120 tokens: the text encoder's chunks set the diffusion model's context" in out


@pytest.mark.parametrize("value,needle", [("-1", "--prompt-tokens -1: expected 0 or more"),
                                          ("many", "Invalid value for '--prompt-tokens'")])
def test_bad_prompt_tokens_is_one_line_exit_2(capsys, sd15, value, needle):
    code = main(["sd-fit", sd15, *CPU, "--prompt-tokens", value])
    _, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
