"""`fitplan sd-fit` on SD 2.1 768-v (the shape-faithful v2-1_768-ema-pruned, F32 as released) at its native
768x768 on a 4 GiB CUDA card: every compute figure is simulated, and the UNet's and OpenCLIP-H's buffers
and the params buffers behind the answer equal what sd-cli logged for that file (the recorded CPU corpus,
planner/sd/data/sd_cli_corpus.json, read row by row). On CUDA, seed 002's `auto` turns flash attention on
everywhere and direct convolution on for the UNet and the VAE."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.sd.sd_compute import CORPUS
from planner.synth.shapes_sd import write_checkpoint

MiB = 1024**2


def logged(n: int) -> float:
    return round(n / MiB, 2)


def corpus_row(family: str, runner: str, side: int, fa: bool, cd: bool) -> int:
    rows = [r for r in json.loads(CORPUS.read_text())["rows"]
            if (r["family"], r["runner"], r["width"], r["height"], r["flash_attn"], r["conv_direct"],
                r.get("vae_tiling", False)) == (family, runner, side, side, fa, cd, False)]
    assert rows, f"no sd-cli row for {family} {runner} {side}x{side} fa={fa} conv_direct={cd}"
    return rows[0]["bytes"]


@pytest.fixture(scope="module")
def v21(tmp_path_factory):
    return str(write_checkpoint("sd2", tmp_path_factory.mktemp("sd2") / "v2-1.safetensors"))


def test_sd2_768_on_4_gib(capsys, v21):
    code = main(["sd-fit", v21, "--width", "768", "--height", "768", "--device", "CUDA0=4GiB", "--ram", "32GiB",
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    p = json.loads(out)
    c = {comp["module"]: comp for comp in p["components"]}
    assert p["verdict"].startswith("fits")
    assert [c[m]["compute_source"] for m in ("diffusion", "te", "vae")] == \
        ["simulated, fa=on,conv_direct=on", "simulated, fa=on,conv_direct=off", "simulated, fa=on,conv_direct=on"]
    assert logged(c["diffusion"]["compute_reserve_bytes"]) == logged(corpus_row("sd2", "unet", 768, True, True))
    assert logged(c["te"]["compute_reserve_bytes"]) == logged(corpus_row("sd2", "clip", 256, True, False))
    params = {r["component"]: r["bytes"] for r in json.loads(CORPUS.read_text())["params"] if r["family"] == "sd2"}
    assert [logged(c[m]["params_buffer_bytes"]) for m in ("diffusion", "te", "vae")] == \
        [logged(params[k]) for k in ("diffusion_model", "text_encoders", "vae")]
