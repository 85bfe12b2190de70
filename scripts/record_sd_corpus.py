"""Record the sd-cli corpus planner/sd/sd_compute.py reads: per runner, the compute buffer sd-cli
logs at a matrix of image sizes and modes, on the shape-faithful checkpoints of
planner/synth/shapes_sd.py and shapes_sd3.py (one sampling step, the weights memory-mapped — `--mmap`, which
changes no buffer; each run is stopped as soon as the buffers it is for are logged, before the
graphs run where that is possible).

    PYTHONPATH=. python scripts/record_sd_corpus.py [--groups sd15,kl-f8,sdxl] [--dir /tmp/sd-corpus]
    PYTHONPATH=. python scripts/record_sd_corpus.py --groups wan-te,wan,wan-vae   # the video model, by frames
    PYTHONPATH=. python scripts/record_sd_corpus.py --groups vulkan-sd15,vulkan-kl-f8 # the Vulkan build, lavapipe
    FITPLAN_SD_CPP_DIR=... PYTHONPATH=. python scripts/record_sd_corpus.py --groups ltx2-vae   # see LTX2_GROUPS

Rows already in the corpus are kept and not run again. planner.sd.sd_compute.FIT_SIZES names the
sizes each curve is solved from; the other rows check it. `params` holds each checkpoint's params buffers
as sd-cli's "total params memory size" line states them.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from planner.sd.sd_cli import SD_CPP_PIN, ensure_sd_cli, run_sd_cli
from planner.sd.sd_compute import CORPUS, CPU_ROWS, FIT_SIZES
from planner.synth.safetensors_factory import write_safetensors
from planner.synth.shapes_ltx import write_ltx2
from planner.synth.shapes_sd import FLUX_FILES, flux_tensors, t5xxl_tensors, write_checkpoint, write_flux
from planner.synth.shapes_sd3 import write_sd3, write_sd35_large, write_z_image
from planner.synth.shapes_wan import write_wan, write_wan22

OFF, FA, CD, BOTH = (False, False), (True, False), (False, True), (True, True)
# group -> (checkpoint family, [(runner, sizes checked beside FIT_SIZES, modes as (flash_attn, conv_direct))]);
# the KL-f8 VAE is recorded on the SD 1.5 checkpoint (SDXL's is the same network)
GROUPS = {
    "sd15": ("sd15", [("unet", ((384, 384), (320, 448), (640, 640), (768, 512), (768, 768)), (OFF, FA, CD, BOTH)),
                      ("clip", (), (OFF, FA))]),
    "kl-f8": ("sd15", [("vae", ((320, 448), (640, 384)), (OFF, FA, CD, BOTH))]),
    "sdxl": ("sdxl", [("unet", ((768, 1024),), (OFF, FA, BOTH)),
                      ("clip", (), (OFF, FA))]),
    "flux": ("flux", [("t5", (), (OFF, FA)), ("clip", (), (OFF, FA))]),
    # FLUX.1's DiT with a one-block T5-XXL: the DiT sees the same 4096 x 256 context from it, and
    # sd-cli reaches the DiT's buffers without running 24 blocks of T5 on the CPU first
    "flux-dit": ("flux-dit", [("flux", ((768, 1024),), (OFF, FA))]),
    # SDXL's VAE has the KL-f8 tensors but sd-cli decodes it with a graph of its own
    "kl-f8-sdxl": ("sdxl", [("vae", ((320, 448),), (OFF, BOTH))]),
    # SD3.5 medium: the text encoders on the released files (T5-XXL as its Q8_0 GGUF); the MMDiT
    # with a one-block T5-XXL (the same 4096-wide context, T5 not run 24 blocks deep first)
    "sd3": ("sd3", [("t5", (), (OFF, FA)), ("clip", (), (OFF, FA))]),
    "sd3-dit": ("sd3-dit", [("mmdit", ((640, 640), (576, 832), (896, 640)), (OFF,)),
                            ("mmdit", ((640, 640), (576, 832)), (FA,)), ("mmdit", ((896, 640),), (CD,))]),
    # with flash attention the MMDiT's peak moves between tensors within the range: two more sizes
    "sd3-dit-fa": ("sd3-dit", [("mmdit", (), (FA,))]),
    # Z-Image-Turbo: Qwen3-4B (Q8_0) and the 30-layer DiT on the released files (no convolution in
    # the DiT: its patch embedding is a matmul)
    "zimage": ("zimage", [("qwen3", (), (OFF, FA)), ("z_image", ((640, 640), (576, 832), (896, 640)), (OFF,)),
                          ("z_image", ((640, 640),), (FA,))]),
    # The 16-channel autoencoder, decoded after one step of a one-layer Z-Image stand-in (Q4_0)
    "ae16": ("zimage-1layer", [("vae", ((320, 320), (448, 320), (256, 448)), (OFF,)), ("vae", ((320, 320),), (BOTH,))]),
    # SD3's decode of the same autoencoder, after one step of the released MMDiT: a check of the
    # ae16 curve (its fit sizes are recorded by "ae16" first and skipped here)
    "ae16-sd3": ("sd3-dit", [("vae", ((320, 256),), (OFF,))]),
    # FLUX.1's decode of the same autoencoder, after one step of a one-double/one-single-block DiT
    # (sd-cli reads the depth from the file; the decode graph does not depend on it) with the
    # one-block T5-XXL: the step is cheap enough to reach the decode's buffer at 1024x1024 (the
    # sizes "ae16" recorded first are skipped; where both ran, the figures agree to the byte)
    "ae16-flux": ("flux-small", [("vae", (), (BOTH, OFF))]),
    # SDXL's decode at 1024x1024 with CUDA's auto modes, after one UNet step at that size (slow on a CPU)
    "kl-f8-sdxl-1024": ("sdxl", [("vae", ((1024, 1024),), (BOTH,))]),
    # SD3.5 large's MMDiT (depth 38) with the one-block T5-XXL stand-in (the same 4096 x 77 context);
    # its params (the DiT and VAE file) logged on the first run
    "sd3-large": ("sd3-large-dit", [("mmdit", ((448, 320),), (OFF, FA))]),
    # SD 2.1 768-v (F32 as released): its UNet up to the native 768x768, its OpenCLIP-H text encoder
    "sd2": ("sd2", [("unet", ((384, 384),), (OFF, FA, CD, BOTH)), ("unet", ((512, 768),), (OFF, FA)),
                    ("clip", (), (OFF, FA))]),
    # -- coverage: every runner with convolutions at >= 3 sizes each with flash attention and direct
    # convolution off and on, every VAE's tiled decode at >= 3 sizes (TILED_SIZES)
    # sd-cli hands --diffusion-conv-direct to the UNet runner alone (src/stable-diffusion.cpp), and
    # FLUX.1's and Z-Image's DiTs have no convolution besides (img_in / x_embedder are Linears on
    # patchified latents): the flag changes nothing for them, which these rows show
    "flux-dit-cd": ("flux-dit", [("flux", ((768, 1024),), (CD,))]),
    "zimage-cd": ("zimage", [("z_image", ((640, 640),), (CD,))]),
    "sd3-dit-both": ("sd3-dit", [("mmdit", ((640, 640),), (BOTH,))]),
    "sdxl-cd": ("sdxl", [("unet", ((768, 1024),), (CD,))]),
    "ae16-modes": ("zimage-1layer", [("vae", ((320, 320),), (FA, CD))]),
    "ae16-tiled": ("zimage-1layer", []),
    "kl-f8-sdxl-modes": ("sdxl", [("vae", ((320, 448),), (FA, CD))]),
    "kl-f8-sdxl-tiled": ("sdxl", []),
    # the text encoders see the prompt, not the image: two more sizes each show the buffer does not move
    "sd15-te": ("sd15", [("clip", ((512, 512), (768, 512)), (OFF,))]),
    "sdxl-te": ("sdxl", [("clip", ((512, 512), (768, 512)), (OFF,))]),
    "flux-te": ("flux", [("t5", ((512, 512), (768, 512)), (OFF,)), ("clip", ((512, 512), (768, 512)), (OFF,))]),
    "sd3-te": ("sd3", [("t5", ((512, 512), (768, 512)), (OFF,)), ("clip", ((512, 512), (768, 512)), (OFF,))]),
    "zimage-te": ("zimage", [("qwen3", ((512, 512), (768, 512)), (OFF,))]),
}
# groups whose rows are not named after FAMILY
ROW_FAMILY = {"sd3-large": "sd3-large",
              "kl-f8-sdxl": "kl-f8-sdxl", "sd3-dit": "sd3", "sd3-dit-fa": "sd3", "ae16": "ae16", "ae16-sd3": "ae16",
              "ae16-flux": "ae16", "kl-f8-sdxl-1024": "kl-f8-sdxl",
              "flux-dit-cd": "flux", "zimage-cd": "zimage", "sd3-dit-both": "sd3", "sdxl-cd": "sdxl",
              "ae16-modes": "ae16", "ae16-tiled": "ae16", "kl-f8-sdxl-modes": "kl-f8-sdxl",
              "kl-f8-sdxl-tiled": "kl-f8-sdxl", "sd15-te": "sd15", "sdxl-te": "sdxl", "flux-te": "flux",
              "sd3-te": "sd3", "zimage-te": "zimage"}
PARAMS_STOP = {"zimage": "qwen3"}   # the first runner to reserve (the params are logged before it); default clip
# checkpoints whose params are not the released ones'
STAND_INS = ("flux-dit", "flux-small", "sd3-dit", "zimage-1layer", "sd3-large-dit")
# stand-ins whose diffusion model file is the released one: its params row is recorded (family, component)
STAND_IN_PARAMS = {"sd3-large-dit": ("sd3-large", ("diffusion_model", "vae"))}
# A text encoder's runner can log several buffers (SDXL's CLIP-L, then OpenCLIP bigG, both "clip"):
# such rows run until the next component's buffer is logged, and keep the largest.
STOP_AFTER = {("sd15", "clip"): "unet", ("sdxl", "clip"): "unet", ("flux", "clip"): "t5", ("sd3", "clip"): "t5"}
# runners that log a compute buffer more than once before the one a row is for: SD 2.x's UNet reserves the
# v-prediction probe's 8x8 graph at load (stable-diffusion.cpp is_using_v_parameterization_for_sd2)
STOP_REPEAT = {("sd2", "unet"): 2}
TILED = ((512, 512), (384, 640), (768, 768))   # the VAE decode with --vae-tiling, default modes
AE16_TILED = ((320, 384),)                      # one tile edge past 32 latent pixels, one under
# group -> the sizes decoded with --vae-tiling (default modes); a tile is 32 latent pixels a side or
# the image's side where that is less, so these sizes give tiles of different shapes
TILED_SIZES = {"kl-f8": TILED, "ae16": AE16_TILED, "ae16-tiled": ((320, 192), (384, 128)),
               "kl-f8-sdxl-tiled": ((320, 384), (320, 192), (384, 128))}
FAMILY = {"unet": None, "clip": None, "t5": None, "vae": "kl-f8", "flux": "flux", "mmdit": None, "z_image": None,
          "qwen3": None}   # None: the checkpoint's


def _model(family: str, work: Path) -> list[str]:
    """The checkpoint's sd-cli file flags, its files written on first use."""
    if family in ("flux", "flux-dit", "flux-small"):
        files = {flag: work / f"flux-{flag.strip('-')}.safetensors" for flag in FLUX_FILES}
        if not all(p.exists() for p in files.values()):
            files = write_flux(work)
        if family == "flux-small":
            files["--diffusion-model"] = work / "flux-dit-1x1.safetensors"
            if not files["--diffusion-model"].exists():
                write_safetensors(files["--diffusion-model"],
                                  {n: ("BF16", s) for n, s in flux_tensors(double=1, single=1).items()})
        if family in ("flux-dit", "flux-small"):
            files["--t5xxl"] = work / "flux-t5xxl-1block.safetensors"
            if not files["--t5xxl"].exists():
                one = {n: s for n, s in t5xxl_tensors().items()
                       if not n.startswith("encoder.block.") or n.startswith("encoder.block.0.")}
                write_safetensors(files["--t5xxl"], {n: ("F16", s) for n, s in one.items()})
        return [a for flag, path in files.items() for a in (flag, str(path))]
    if family in ("sd3", "sd3-dit", "sd3-large-dit"):
        files = write_sd35_large(work, t5_layers=1) if family == "sd3-large-dit" \
            else write_sd3(work, t5_layers=1 if family == "sd3-dit" else 24)
        return [a for flag, path in files.items() for a in (flag, str(path))]
    if family in ("zimage", "zimage-1layer"):
        files = write_z_image(work, **({"layers": 1, "dit_gguf": "Q4_0"} if family == "zimage-1layer" else {}))
        return [a for flag, path in files.items() for a in (flag, str(path))]
    model = work / f"{family}.safetensors"
    if not model.exists():
        write_checkpoint(family, model)
    return ["-m", str(model)]


def _args(model: list[str], width: int, height: int, fa: bool, conv: bool, tiled: bool) -> list[str]:
    args = [*model, "-p", "a cat", "-W", str(width), "-H", str(height), "--steps", "1",
            "--cfg-scale", "1", "-t", "2", "--seed", "1", "--mmap", "-o", str(Path(model[-1]).with_suffix(".png"))]
    if fa:
        args.append("--fa")
    if conv:
        args += ["--diffusion-conv-direct", "--vae-conv-direct"]
    if tiled:
        args.append("--vae-tiling")
    return args


# sd-cli aligns -W and -H up to the VAE's 8 times the diffusion model's down factor (src/stable-diffusion.cpp
# align_image_size, get_diffusion_model_down_factor): 8 for a UNet, 1 for an image DiT. A row must name the
# size sd-cli ran, so the recorder refuses one it would align.
SPATIAL_MULTIPLE = {"sd15": 64, "sdxl": 64, "sd2": 64}   # checkpoint -> multiple; 8 for the others


def _check_size(family: str, width: int, height: int) -> None:
    multiple = SPATIAL_MULTIPLE.get(family, 8)
    if width % multiple or height % multiple:
        raise SystemExit(f"{family} {width}x{height}: sd-cli aligns the size up to a multiple of {multiple}")


def _key(row: dict) -> tuple:
    return (*(row[k] for k in ("family", "runner", "width", "height", "flash_attn", "conv_direct", "vae_tiling")),
            row.get("frames", 1), row.get("temporal_tiling", False), row.get("batch", 1),
            row.get("backend", CPU_ROWS), row.get("max_vram"), row.get("prompt_tokens"))


def _params_rows(group: str, family: str, model: list[str], exe: Path, have: set[str]) -> list[dict]:
    """The checkpoint's params buffers (logged before any graph) where not recorded yet in this run
    (`have`): every component of a released checkpoint, the released file's components of a stand-in
    in STAND_IN_PARAMS, none for other stand-ins."""
    if family in STAND_IN_PARAMS:
        name, components = STAND_IN_PARAMS[family]
    elif family not in STAND_INS and group not in ROW_FAMILY:
        name, components = family, None
    else:
        return []
    if name in have:
        return []
    got = run_sd_cli(_args(model, 256, 256, False, False, False), exe=exe,
                     stop_when=[PARAMS_STOP.get(family, "clip")], timeout_s=3600)
    return [{"family": name, "component": c, "bytes": size} for c, size in got.totals
            if components is None or c in components]


def record(groups: list[str], work: Path, done: set[tuple],
           save: Callable[[list[dict], list[dict]], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Corpus rows for `groups` (skipping keys in `done`), and each checkpoint's params totals;
    `save` is handed both after every run (a long recording keeps what it has)."""
    exe = ensure_sd_cli()
    rows, params = [], []
    for group in groups:
        family, runners = GROUPS[group]
        model = _model(family, work)
        plan = [(runner, size, mode, False)
                for runner, checks, modes in runners for mode in modes
                for size in FIT_SIZES[(ROW_FAMILY.get(group) or FAMILY[runner] or family, runner)] + checks]
        new = _params_rows(group, family, model, exe, {p["family"] for p in params})
        if new:
            params += new
            if save:
                save(rows, params)
        plan += [("vae", size, OFF, True) for size in TILED_SIZES.get(group, ())]
        for runner, (width, height), (fa, conv), tiled in plan:
            row = {"family": ROW_FAMILY.get(group) or FAMILY[runner] or family, "runner": runner, "width": width,
                   "height": height, "flash_attn": fa, "conv_direct": conv, "vae_tiling": tiled}
            if _key(row) in done:
                continue
            _check_size(family, width, height)
            args = _args(model, width, height, fa, conv, tiled)
            stop = [STOP_AFTER.get((family, runner), runner)] * STOP_REPEAT.get((family, runner), 1)
            got = run_sd_cli(args, exe=exe, stop_when=stop, timeout_s=3600)
            _recorded(row, got.compute_of(runner), args, work)
            rows.append(row)
            done.add(_key(row))   # a later group of the same family skips it
            if save:
                save(rows, params)
    return rows, params



def _recorded(row: dict, figure: int, args: list[str], work: Path, **extra: object) -> None:
    """Complete `row` with sd-cli's logged figure and the argv it ran (file names without the work
    directory), and echo it without the argv."""
    row.update({"bytes": figure, **extra, "argv": ["sd-cli", "-v", *[Path(a).name if a.startswith(str(work)) else a
                                                                     for a in args]]})
    print(json.dumps({k: v for k, v in row.items() if k != "argv"}), flush=True)


# ---- video: Wan2.1-T2V-1.3B (planner/synth/shapes_wan.py), rows by (width, height, frames)
# group -> [(runner, flash_attn, vae_tiling, [(width, height, frames), ...])]; the fit points are
# planner.sd.sd_compute.FIT_VIDEO's, the others check them. "wan-te" runs the full UMT5-XXL encoder
# (Q4_0; its params are recorded on the first run) and stops at its buffer; "wan" and "wan-vae" run
# a one-block UMT5 stand-in (the DiT sees the same 512 x 4096 context) so that sd-cli reaches the
# DiT's buffer, and the VAE's after one DiT step, without 24 UMT5 blocks on the CPU.
WAN_DIT_RUNNER, WAN_VAE_RUNNER = "Wan2.1-T2V-1.3B", "wan_vae"
WAN_GROUPS: dict[str, list[tuple[str, bool, bool, list[tuple[int, int, int]]]]] = {
    "wan-te": [("t5", False, False, [(256, 256, 1), (416, 240, 9)]), ("t5", True, False, [(256, 256, 1)])],
    "wan": [(WAN_DIT_RUNNER, False, False, [(256, 256, 1), (256, 256, 5), (256, 256, 9), (256, 256, 17),
                                            (320, 192, 1), (320, 192, 9), (416, 240, 5), (416, 240, 17)]),
            (WAN_DIT_RUNNER, True, False, [(256, 256, 1), (256, 256, 9), (256, 256, 17), (320, 192, 5),
                                           (416, 240, 17), (256, 256, 5)])],
    # each VAE row runs one DiT step first (its cost grows with width x height x frames on two CPU
    # cores): small sizes, the frame axis mostly at 128x128; the peer test checks larger ones live
    "wan-vae": [(WAN_VAE_RUNNER, False, False, [(128, 128, f) for f in (1, 5, 9, 17)]
                 + [(256, 256, 1), (256, 256, 5), (192, 128, 9), (192, 128, 13), (192, 128, 5), (160, 128, 9),
                    (192, 128, 17), (128, 128, 33), (128, 128, 25)]),
                (WAN_VAE_RUNNER, True, False, [(128, 128, 5)]),
                (WAN_VAE_RUNNER, False, True, [(320, 128, 1)])],
    # coverage: flash attention and --vae-tiling at >= 3 sizes each (tiles of different shapes)
    "wan-vae-modes": [(WAN_VAE_RUNNER, True, False, [(128, 128, 1), (192, 128, 9)]),
                      (WAN_VAE_RUNNER, False, True, [(384, 192, 1), (288, 160, 5)])],
    # with --diffusion-conv-direct --vae-conv-direct: sd-cli hands the first to the UNet alone, and the
    # DiT's patch embedding is a Conv3d besides (no direct variant: ggml_ext_conv_3d), so the DiT's rows
    # show no change; the VAE's causal convolutions are Conv3d too, but its 2-D up-sampling convolutions
    # (Resample's resample.1) and its attention's 1x1 projections are Conv2d and do switch
    "wan-cd": [(WAN_DIT_RUNNER, False, False, [(256, 256, 1), (256, 256, 5), (320, 192, 9)]),
               (WAN_DIT_RUNNER, True, False, [(256, 256, 1), (256, 256, 9), (320, 192, 5)])],
    "wan-vae-cd": [(WAN_VAE_RUNNER, False, False, [(128, 128, 1), (128, 128, 5), (192, 128, 9), (160, 128, 5)]),
                   (WAN_VAE_RUNNER, True, False, [(128, 128, 5)])],
    "wan-te-sizes": [("t5", False, False, [(320, 192, 5)])],
}
WAN_CONV_DIRECT = {"wan-cd", "wan-vae-cd"}   # groups run with the conv-direct flags
# Wan2.1-T2V-14B's DiT (sd-cli names the runner for the 14B T2V layout of either 2.x version) with the
# one-block UMT5 stand-in; its params (the DiT file) logged on the first run
WAN14_DIT_RUNNER = "Wan2.x-T2V-14B"
WAN_GROUPS["wan-14b"] = [(WAN14_DIT_RUNNER, fa, False, [(128, 128, 1), (256, 256, 1), (128, 128, 5), (256, 256, 5),
                                                        (128, 128, 9), (192, 128, 9)]) for fa in (False, True)]
WAN_FAMILY = {"t5": "wan", WAN_DIT_RUNNER: "wan", WAN_VAE_RUNNER: "wan-vae", WAN14_DIT_RUNNER: "wan-14b"}
# Wan2.2-TI2V-5B (shapes_wan.write_wan22) with the one-block UMT5 stand-in: its DiT (one timestep per
# latent frame) and its 48-channel VAE, whose sides are a multiple of 32 px (16x VAE, 2x2 patches) and
# frames 4k+1; the DiT's and the VAE's params logged on the group's first run
WAN22_DIT_RUNNER = "Wan2.2-TI2V-5B"
WAN_GROUPS["wan22"] = [(WAN22_DIT_RUNNER, fa, False, [(128, 128, 1), (128, 128, 5), (256, 128, 9), (320, 192, 1),
                                                      (320, 192, 9)]) for fa in (False, True)]
WAN_GROUPS["wan22-vae"] = [(WAN_VAE_RUNNER, False, False, [(128, 128, 1), (128, 128, 5), (192, 128, 9), (256, 128, 5)]),
                           (WAN_VAE_RUNNER, True, False, [(128, 128, 5)]),
                           (WAN_VAE_RUNNER, False, True, [(320, 192, 1), (640, 128, 1)])]
# with the conv-direct flags (WAN_CONV_DIRECT): the 2.2 VAE's Resample and attention Conv2ds switch too
WAN_GROUPS["wan22-vae-cd"] = [(WAN_VAE_RUNNER, False, False, [(128, 128, 5), (192, 128, 9)])]
WAN_GROUPS["wan22-frames"] = [(WAN22_DIT_RUNNER, fa, False, [(128, 128, 17)]) for fa in (False, True)]
WAN_CONV_DIRECT.add("wan22-vae-cd")
WAN22_FAMILY = {WAN22_DIT_RUNNER: "wan22", WAN_VAE_RUNNER: "wan22-vae"}


def _wan_args(files: dict[str, Path], width: int, height: int, frames: int, fa: bool, tiled: bool,
              conv: bool = False) -> list[str]:
    args = ["-M", "vid_gen", *[a for flag, path in files.items() for a in (flag, str(path))],
            "-p", "a cat", "-W", str(width), "-H", str(height), "--video-frames", str(frames), "--steps", "1",
            "--cfg-scale", "1", "-t", "2", "--seed", "1", "--mmap", "-o", str(files["--vae"].with_name("wan.webm"))]
    return args + (["--fa"] if fa else []) + (["--vae-tiling"] if tiled else []) \
        + (["--diffusion-conv-direct", "--vae-conv-direct"] if conv else [])


def record_wan(groups: list[str], work: Path, done: set[tuple], save) -> list[dict]:
    """Wan corpus rows for `groups` (skipping keys in `done`); `save(row, params)` is called after
    each run, so an interrupted recording keeps what it has."""
    exe = ensure_sd_cli()
    full = write_wan(work, "Q4_0")
    stand_in = dict(full, **{"--t5xxl": write_wan(work, "Q8_0", te_layers=1)["--t5xxl"]})
    rows = []
    for group in groups:
        files = full if group.startswith("wan-te") else stand_in   # the full UMT5 for its own buffer
        if group == "wan-14b":
            files = write_wan(work, "Q8_0", te_layers=1, size="14B")
        if group.startswith("wan22"):
            files = write_wan22(work, "Q8_0", te_layers=1)
        conv = group in WAN_CONV_DIRECT
        for runner, fa, tiled, points in WAN_GROUPS[group]:
            for width, height, frames in points:
                family = WAN22_FAMILY[runner] if group.startswith("wan22") else WAN_FAMILY[runner]
                row = {"family": family, "runner": runner, "width": width, "height": height,
                       "frames": frames, "flash_attn": fa, "conv_direct": conv, "vae_tiling": tiled}
                if _key(row) in done:
                    continue
                args = _wan_args(files, width, height, frames, fa, tiled, conv)
                got = run_sd_cli(args, exe=exe, stop_when=[runner], timeout_s=3600)
                params = [{"family": "wan", "component": name, "bytes": size} for name, size in got.totals] \
                    if group == "wan-te" else []
                if group == "wan-14b" and not rows:
                    params = [{"family": "wan-14b", "component": name, "bytes": size} for name, size in got.totals
                              if name == "diffusion_model"]
                if group == "wan22" and not rows:
                    params = [{"family": "wan22", "component": name, "bytes": size} for name, size in got.totals
                              if name in ("diffusion_model", "vae")]
                _recorded(row, got.compute_of(runner), args, work)
                rows.append(row)
                done.add(_key(row))
                save(row, params)
    return rows


def _params_key(p: dict) -> tuple[str, str]:
    return p["family"], p.get("backend", CPU_ROWS)


# ---- the Vulkan build (scripts/build_sd_cpp.sh --vulkan) on Mesa's lavapipe, rows marked "backend": "vulkan".
# Only sizes whose every tensor stays within lavapipe's maxStorageBufferRange (128 MiB): ggml-vulkan refuses a node
# with a larger source or result, and sd-cli then reserves the graph with a scheduler and a CPU fallback, which
# logs no compute buffer (ggml_extend.hpp alloc_compute_buffer). One run logs every runner named, in order.
# group -> (checkpoint family, runners logged by one run, sizes, modes)
VULKAN = "vulkan"
VULKAN_GROUPS: dict[str, tuple[str, tuple[str, ...], tuple[tuple[int, int], ...], tuple[tuple[bool, bool], ...]]] = {
    # CLIP-L, then the UNet: without flash attention KQ is (latent pixels)^2 x 8 heads of f32, 112.5 MiB at 320x384
    "vulkan-sd15": ("sd15", ("clip", "unet"), ((256, 256), (320, 320), (320, 384)), (OFF, FA, CD, BOTH)),
    # the decode, after one UNet step on lavapipe: that step ran to the end at 128x128 without direct convolution
    # once; other runs ended in a crash inside it (SIGSEGV at 128x128 with direct convolution for the UNet or the
    # VAE alone, SIGABRT at 192x128), after the UNet's buffers were logged
    "vulkan-kl-f8": ("sd15", ("vae",), ((128, 128),), (OFF,)),
    # with --max-vram vulkan0=8: sd-cli plans each runner's graph cuts, the whole graph fits one segment
    "vulkan-sd15-cuts": ("sd15", ("clip", "unet"), ((256, 256), (320, 320)), (OFF, FA, BOTH)),
    # sd-fit's SDXL answer on an 8 GiB card: the UNet's params on the device, the text encoders' and the VAE's
    # on the host (lavapipe's memory holds no more); stopped once the UNet's buffer is logged
    "vulkan-sdxl-cuts": ("sdxl", ("unet",), ((1024, 1024),), (BOTH,)),
}
# the groups run with --max-vram (rows marked "max_vram"), and their further arguments
VULKAN_MAX_VRAM = {"vulkan-sd15-cuts": "vulkan0=8", "vulkan-sdxl-cuts": "vulkan0=8"}
VULKAN_EXTRA = {"vulkan-sdxl-cuts": ["--params-backend", "te=cpu,vae=cpu"]}
VULKAN_FAMILY = {"clip": "sd15", "unet": "sd15", "vae": "kl-f8"}   # the SD 1.5 checkpoint's runners


def vulkan_args(model: list[str], width: int, height: int, fa: bool, conv: bool) -> list[str]:
    """sd-cli's arguments for a run on Vulkan0 (lavapipe, named by GGML_VK_VISIBLE_DEVICES=0)."""
    return [*_args(model, width, height, fa, conv, False), "--backend", "vulkan0"]


def record_vulkan(groups: list[str], work: Path, done: set[tuple], save) -> None:
    """Vulkan rows for `groups` (skipping keys in `done`) and, on the first run, the params buffers;
    `save(rows, params)` after each run."""
    exe = ensure_sd_cli(backend=VULKAN)
    for group in groups:
        family, runners, sizes, modes = VULKAN_GROUPS[group]
        model = _model(family, work)
        for (fa, conv), (width, height) in ((m, s) for m in modes for s in sizes):
            max_vram = VULKAN_MAX_VRAM.get(group)
            rows = [{"family": VULKAN_FAMILY[r] if family == "sd15" else family, "runner": r, "width": width,
                     "height": height, "flash_attn": fa, "conv_direct": conv, "vae_tiling": False, "backend": VULKAN,
                     **({"max_vram": max_vram} if max_vram else {})} for r in runners]
            rows = [r for r in rows if _key(r) not in done]
            if not rows:
                continue
            args = vulkan_args(model, width, height, fa, conv) + (["--max-vram", max_vram] if max_vram else []) \
                + VULKAN_EXTRA.get(group, [])
            got = run_sd_cli(args, exe=exe, stop_when=[r["runner"] for r in rows], timeout_s=1800, backend=VULKAN)
            params = [{"family": family, "component": name, "bytes": size, "backend": VULKAN}
                      for name, size in got.totals] if (family, VULKAN) not in done else []
            done.add((family, VULKAN))
            for row in rows:
                _recorded(row, got.compute_of(row["runner"]), args, work)
                done.add(_key(row))
            save(rows, params)


# ---- video: LTX-2's video VAE (planner/synth/shapes_ltx.py: the VAE shape-faithful, a DiT without
# blocks and a layerless Gemma stand-in ahead of it), decoded whole and with --temporal-tiling (its
# latent frames four at a time, one overlapping: each tile a graph of its own, the largest buffer
# kept, so these runs are not stopped early). The Gemma tokenizer aborts unless its one-byte vocabulary
# stand-in parses as JSON: scripts/build_sd_cpp.sh writes "0"; a build with a NUL there cannot load it.
LTX2_VAE_RUNNER = "ltx_video_vae"
LTX2_GROUPS: dict[str, list[tuple[bool, list[tuple[int, int, int]]]]] = {
    "ltx2-vae": [(False, [(64, 64, 9), (64, 64, 41), (128, 128, 17), (96, 64, 57)]),
                 (True, [(64, 64, 9), (64, 64, 41), (128, 128, 17), (96, 64, 57)])],
}


def record_ltx2(groups: list[str], work: Path, done: set[tuple], save) -> list[dict]:
    """LTX-2 VAE rows for `groups` (skipping keys in `done`), each saved as it is recorded."""
    exe = ensure_sd_cli()
    model = write_ltx2(work / "ltx2-vae.safetensors")
    rows = []
    for group in groups:
        for temporal, points in LTX2_GROUPS[group]:
            for width, height, frames in points:
                row = {"family": group, "runner": LTX2_VAE_RUNNER, "width": width, "height": height,
                       "frames": frames, "flash_attn": False, "conv_direct": False, "vae_tiling": False,
                       "temporal_tiling": temporal}
                if _key(row) in done:
                    continue
                args = ["-M", "vid_gen", "-m", str(model), "-p", "a cat", "-W", str(width), "-H", str(height),
                        "--video-frames", str(frames), "--steps", "1", "--cfg-scale", "1", "-t", "2", "--seed", "1",
                        "--mmap", "-o", str(model.with_suffix(".webm"))] + (["--temporal-tiling"] if temporal else [])
                got = run_sd_cli(args, exe=exe, stop_when=() if temporal else [LTX2_VAE_RUNNER], timeout_s=3600)
                # the VAE's params (shape-faithful); the thin DiT's and text encoder's are not the model's
                params = [{"family": group, "component": name, "bytes": size} for name, size in got.totals
                          if name == "vae"]
                _recorded(row, got.compute_of(LTX2_VAE_RUNNER), args, work)
                rows.append(row)
                done.add(_key(row))
                save(row, params)
    return rows


# ---- batch: sd-cli's -b N (--batch-count). generate_image samples the N images one after another and
# decode_image_outputs decodes them one at a time (src/stable-diffusion.cpp), each runner re-reserving its
# compute buffer per image. A batch run goes on until `runner` has logged its buffer `logs` times (the
# runners before it logged theirs for every image by then); a row keeps every figure its runner logged
# ("logged", one per image it reached) and their largest as "bytes".
# group -> (checkpoint family, [(width, height, batch, last runner, its logs)], {runner: row family})
BATCH_GROUPS: dict[str, tuple[str, list[tuple[int, int, int, str, int]], dict[str, str]]] = {
    # SD 1.5: CLIP once, the UNet per image, the KL-f8 decode per image; at 256x256 each run
    # reaches every image's decode, at the larger sizes the second decode (b 2) or the first (b 4)
    "sd15-batch": ("sd15", [(256, 256, 2, "vae", 2), (256, 256, 4, "vae", 4), (320, 448, 2, "vae", 2),
                            (320, 448, 4, "vae", 1), (384, 384, 2, "vae", 2), (384, 384, 4, "vae", 1)],
                   {"clip": "sd15", "unet": "sd15", "vae": "kl-f8"}),
    # Z-Image-Turbo's 30-layer DiT: Qwen3-4B once, the DiT per image (stopped at the last image's
    # buffer, before its step runs)
    "zimage-batch": ("zimage", [(256, 256, 2, "z_image", 2), (256, 256, 4, "z_image", 4)],
                     {"qwen3": "zimage", "z_image": "zimage"}),
}


def record_batch(groups: list[str], work: Path, done: set[tuple], save) -> list[dict]:
    """Batch rows for `groups` (skipping keys in `done`); `save(rows)` after each run."""
    exe = ensure_sd_cli()
    rows: list[dict] = []
    for group in groups:
        family, runs, row_family = BATCH_GROUPS[group]
        model = _model(family, work)
        for width, height, batch, last, logs in runs:
            new = [{"family": row_family[runner], "runner": runner, "width": width, "height": height,
                    "flash_attn": False, "conv_direct": False, "vae_tiling": False, "batch": batch}
                   for runner in row_family]
            if all(_key(row) in done for row in new):
                continue
            args = [*_args(model, width, height, False, False, False), "-b", str(batch)]
            got = run_sd_cli(args, exe=exe, stop_when=[last], stop_after=logs, timeout_s=3600)
            for row in new:
                _recorded(row, got.compute_of(row["runner"]), args, work, logged=list(got.logged_of(row["runner"])))
                done.add(_key(row))
            rows += new
            save(new)
    return rows


# ---- long prompts: "cat" repeated N times is N tokens to CLIP's BPE ("cat</w>" is one vocabulary entry);
# CLIP pads the prompt to 77 tokens, or past 75 splits it into ceil(N / 75) chunks of 77 (src/tokenizers/
# tokenizer.cpp pad_tokens), encodes each chunk alone and hands the UNet their concatenation
# (src/conditioning/conditioner.hpp). FLUX.1's T5-XXL: "cat" x N is N SentencePiece tokens ("▁cat"), padded
# with EOS to 256, or past 255 split into chunks of 255 + EOS (FluxCLIPEmbedder); its DiT's context is
# the chunks' concatenation. Rows carry "prompt_tokens": N.
# group -> (checkpoint family, row family, [(width, height, flash_attn, N)], runners)
PROMPT_GROUPS: dict[str, tuple[str, str, list[tuple[int, int, bool, int]], tuple[str, ...]]] = {
    "sd15-prompt": ("sd15", "sd15", [(256, 256, False, 75), (256, 256, False, 76), (256, 256, False, 200),
                                     (320, 448, True, 120), (256, 256, True, 300)], ("clip", "unet")),
    # SDXL's CLIP-L and OpenCLIP bigG chunk the prompt alike (their hidden states side by side per token),
    # SD 2.x's OpenCLIP-H as SD 1.x's CLIP-L
    "sdxl-prompt": ("sdxl", "sdxl", [(256, 256, False, 76), (256, 256, True, 200)], ("clip", "unet")),
    "sd2-prompt": ("sd2", "sd2", [(256, 256, False, 76), (256, 256, True, 200)], ("clip", "unet")),
    # the DiT with the one-block T5-XXL stand-in (the same 4096-wide context, cheap to run per chunk)
    "flux-prompt": ("flux-dit", "flux", [(256, 256, False, 255), (256, 256, False, 256), (256, 256, True, 600)],
                    ("flux",)),
    # the released T5-XXL: one 256-token chunk's graph whatever the prompt (stopped at its buffer)
    "flux-prompt-te": ("flux", "flux", [(256, 256, False, 600)], ("clip", "t5")),
    # SD3.5 medium's MMDiT (one-block T5-XXL stand-in): per chunk CLIP-L/G's 77 tokens, then T5's 77
    # (76 + EOS); lengths where CLIP and T5 cut the same number of chunks
    "sd3-prompt": ("sd3-dit", "sd3", [(256, 256, False, 100), (256, 256, True, 200)], ("mmdit",)),
    # Z-Image: Qwen3-4B reads the whole prompt in its chat template, no chunks, no padding ("cat" x N is
    # N Qwen tokens: "cat", then " cat"), and the DiT's caption stream is those tokens
    "zimage-prompt": ("zimage", "zimage", [(256, 256, False, 100), (256, 256, True, 300)], ("qwen3", "z_image")),
}


def record_prompt(groups: list[str], work: Path, done: set[tuple], save) -> list[dict]:
    """Long-prompt rows for `groups` (skipping keys in `done`); `save(rows)` after each run."""
    exe = ensure_sd_cli()
    rows: list[dict] = []
    for group in groups:
        family, row_family, runs, runners = PROMPT_GROUPS[group]
        model = _model(family, work)
        for width, height, fa, tokens in runs:
            new = [{"family": row_family, "runner": runner, "width": width, "height": height, "flash_attn": fa,
                    "conv_direct": False, "vae_tiling": False, "prompt_tokens": tokens} for runner in runners]
            if all(_key(row) in done for row in new):
                continue
            args = _args(model, width, height, fa, False, False)
            args[args.index("-p") + 1] = " ".join(["cat"] * tokens)
            stop = [runners[-1]] * STOP_REPEAT.get((family, runners[-1]), 1)
            got = run_sd_cli(args, exe=exe, stop_when=stop, timeout_s=3600)
            for row in new:
                _recorded(row, got.compute_of(row["runner"]), args, work)
                done.add(_key(row))
            rows += new
            save(new)
    return rows


def _write(out: Path, old: dict, rows: list[dict], params: list[dict]) -> None:
    """The corpus `old` with `rows` appended and `params` replacing its params of the same checkpoints and
    backends."""
    families = {_params_key(p) for p in params}
    kept = [p for p in old.get("params", []) if _params_key(p) not in families]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sd_cpp": SD_CPP_PIN, "rows": old["rows"] + rows, "params": kept + params},
                              indent=1) + "\n")


def _load(out: Path) -> dict:
    return json.loads(out.read_text()) if out.exists() else {"rows": [], "params": []}


def _save(out: Path, rows: list[dict], params: list[dict]) -> None:
    """Append `rows` to the corpus as it is on disk now."""
    _write(out, _load(out), rows, params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"image groups {', '.join(GROUPS)}; video groups "
                             f"{', '.join([*WAN_GROUPS, *LTX2_GROUPS])}; batch groups {', '.join(BATCH_GROUPS)}; "
                             f"prompt groups {', '.join(PROMPT_GROUPS)}; "
                             f"Vulkan groups {', '.join(VULKAN_GROUPS)}")
    parser.add_argument("--dir", default="/tmp/sd-corpus")
    parser.add_argument("--out", default=str(CORPUS))
    ns = parser.parse_args()
    work = Path(ns.dir)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(ns.out)
    old = _load(out)
    groups = ns.groups.split(",")
    prompt = [g for g in groups if g in PROMPT_GROUPS]
    if prompt:
        record_prompt(prompt, work, {_key(r) for r in old["rows"]}, lambda rows: _save(out, rows, []))
    batch = [g for g in groups if g in BATCH_GROUPS]
    if batch:
        record_batch(batch, work, {_key(r) for r in old["rows"]}, lambda rows: _save(out, rows, []))
    video = [g for g in groups if g in WAN_GROUPS]
    if video:
        record_wan(video, work, {_key(r) for r in old["rows"]}, lambda row, params: _save(out, [row], params))
    ltx2 = [g for g in groups if g in LTX2_GROUPS]
    if ltx2:
        record_ltx2(ltx2, work, {_key(r) for r in _load(out)["rows"]}, lambda row, params: _save(out, [row], params))
    vulkan = [g for g in groups if g in VULKAN_GROUPS]
    if vulkan:
        done = {_key(r) for r in old["rows"]} | {(p["family"], VULKAN) for p in old["params"] if p.get("backend")}
        record_vulkan(vulkan, work, done, lambda rows, params: _save(out, rows, params))
    image = [g for g in groups if g not in WAN_GROUPS and g not in LTX2_GROUPS and g not in BATCH_GROUPS
             and g not in VULKAN_GROUPS and g not in PROMPT_GROUPS]
    if image:   # record() hands its rows so far after every run: written beside the corpus as it was
        before = _load(out)
        _write(out, before, *record(image, work, {_key(r) for r in before["rows"]},
                                    lambda rows, params: _write(out, before, rows, params)))


if __name__ == "__main__":
    main()
