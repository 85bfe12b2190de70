"""Seed 002's items that an audit of sd-fit found absent or partial, one test each, named after
the item and asserting the seed's rule (docs/guides/stable-diffusion.md, "Seed 002 items", lists
them with the code that implements each)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cli import main
from planner.core.errors import FlagError
from planner.core.units import GiB, MiB
from planner.sd.autofit import greedy_fit
from planner.sd.check import device_needs
from planner.sd.components import COMPUTE_RESERVE, Component, SdTensor, read_components
from planner.sd.family import family
from planner.sd.modes import Feature, Switch, decide, last_flash_attn, legacy_modes, parse_modes
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.sd.sd_compute import CORPUS, Mode, compute_bytes
from planner.sd.sd_placement import MappedFile, Placement, Where
from planner.sd.split import row_shares
from planner.sd.vae_retry import Decoder, decoder_of, retry_order
from planner.synth.safetensors_factory import write_safetensors
from planner.synth.shapes_ltx import write_ltx2
from planner.synth.shapes_sd import write_checkpoint
from planner.synth.shapes_wan import wan_dit_tensors, wan_vae_tensors
from tests.planner.sd.helpers_sd import comp, gpu, problem

FA, CD = Feature.FLASH_ATTN, Feature.CONV_DIRECT
CPU_DEV: tuple[tuple[str, str], ...] = ()
CUDA = ("CUDA", "NVIDIA GeForce RTX 4090")


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    return str(write_checkpoint("sd15", tmp_path_factory.mktemp("seed002") / "sd15.safetensors"))


def fit_json(capsys, *args):
    code = main(["sd-fit", *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def by_module(p):
    return {c["module"]: c for c in p["components"]}


# --- --flash-attn: seven items --------------------------------------------------------------

def test_flash_attn_modes_default_auto():
    # "--flash-attn defaults to auto"; on | off | auto
    assert parse_modes(None, FA).of("diffusion") is Switch.AUTO
    assert [parse_modes(m, FA).default for m in ("on", "off", "auto")] == [Switch.ON, Switch.OFF, Switch.AUTO]


def test_flash_attn_module_settings_win_and_last_setting_wins():
    # "module-specific settings take precedence regardless of their position ... the last setting
    # for the same module or default wins"; all= / default= / *= set the default
    spec = parse_modes("te=off,on,clip=on,text=off,*=off,default=on", FA)
    assert spec.of("te") is Switch.OFF and spec.default is Switch.ON and spec.of("vae") is Switch.ON


def test_flash_attn_modules_and_rejection():
    # "Supported modules are diffusion, te, clip_vision, vae, controlnet, and audio_encoder ...
    # Modules without configurable attention are rejected"
    assert FA.modules == {"diffusion", "te", "clip_vision", "vae", "controlnet", "audio_encoder"}
    for module in ("upscaler", "photomaker", "detector"):
        with pytest.raises(FlagError):
            parse_modes(f"{module}=on", FA)


def test_flash_attn_auto_on_for_cpu_and_cuda():
    # "auto enables CPU and supported CUDA MMA configurations without timing a benchmark"
    assert decide(parse_modes("auto", FA), "diffusion", CPU_DEV) is True
    assert decide(parse_modes("auto", FA), "diffusion", (CUDA,)) is True


def test_flash_attn_auto_vulkan_rtx_by_name_else_benchmarked():
    # "Vulkan devices whose description identifies NVIDIA RTX hardware ... also skip timing";
    # others are benchmarked at start-up, which a planner cannot run: sd-fit takes off (more memory)
    auto = parse_modes("auto", FA)
    for name in ("NVIDIA GeForce RTX 3060", "NVIDIA TITAN RTX", "Quadro RTX 5000", "NVIDIA RTX A6000"):
        assert decide(auto, "vae", (("Vulkan", name),)) is True
    assert decide(auto, "vae", (("Vulkan", "AMD Radeon RX 7900 XTX"),)) is False
    assert decide(auto, "vae", (("Vulkan", "NVIDIA GeForce GTX 1080"),)) is False


def test_flash_attn_multi_device_needs_every_device_on():
    # "A multi-device model enables flash attention only if all of its compute devices select on"
    auto = parse_modes("auto", FA)
    assert decide(auto, "diffusion", (CUDA, ("Vulkan", "AMD Radeon RX 7900 XTX"))) is False
    assert decide(auto, "diffusion", (CUDA, ("Vulkan", "NVIDIA GeForce RTX 4070"))) is True


def test_flash_attn_explicit_module_setting_does_not_change_another_module():
    # "An explicit on or off for one module does not change another module's decision, even when
    # they share a backend"; "Different modules can select different results"
    spec = parse_modes("auto,te=off", FA)
    assert decide(spec, "te", CPU_DEV) is False and decide(spec, "diffusion", CPU_DEV) is True


# --- --conv-direct: six items --------------------------------------------------------------

def test_conv_direct_modes_default_auto_and_modules():
    # "--conv-direct defaults to auto and accepts module assignments for diffusion, vae ... and
    # controlnet"; a module without convolution settings is rejected
    assert parse_modes(None, CD).of("vae") is Switch.AUTO
    assert CD.modules == {"diffusion", "vae", "controlnet"}
    with pytest.raises(FlagError):
        parse_modes("te=on", CD)


def test_conv_direct_auto_on_for_cuda_and_musa():
    # CUDA 2D implicit GEMM (Turing or newer, taken as present); MUSA has a SIMT implementation
    auto = parse_modes("auto", CD)
    assert decide(auto, "vae", (CUDA,)) is True
    assert decide(auto, "vae", (("MUSA", "MTT S80"),)) is True


def test_conv_direct_auto_off_elsewhere():
    # "Other backends default to off"; Vulkan is benchmarked and HIP depends on the architecture,
    # which a planner cannot see: off
    auto = parse_modes("auto", CD)
    for backend in (("CPU", ""), ("Vulkan", "NVIDIA GeForce RTX 4090"), ("HIP", "gfx1100"), ("Metal", "")):
        assert decide(auto, "diffusion", (backend,)) is False
    assert decide(auto, "diffusion", CPU_DEV) is False


def test_conv_direct_every_compute_device_must_qualify():
    # "all compute devices in a module must qualify"
    assert decide(parse_modes("auto", CD), "diffusion", (CUDA, ("Vulkan", "AMD Radeon"))) is False


def test_conv_direct_legacy_flags_and_explicit_precedence():
    # --diffusion-conv-direct = auto,diffusion=on,controlnet=on; --vae-conv-direct = auto,vae=on;
    # "An explicit --conv-direct takes precedence over both legacy flags regardless of order"
    assert legacy_modes(None, CD, diffusion_on=True) == "auto,diffusion=on,controlnet=on"
    assert legacy_modes(None, CD, vae_on=True) == "auto,vae=on"
    assert legacy_modes("off", CD, diffusion_on=True, vae_on=True) == "off"


def test_conv_direct_parameter_storage_devices_do_not_affect(capsys, sd15):
    # "Parameter-storage devices do not affect this choice": the UNet computes on CUDA0 with its
    # parameters in RAM; the mode is CUDA's (on), not the CPU's (off)
    p = fit_json(capsys, sd15, "--device", "CUDA0=24GiB", "--ram", "64GiB", "--backend", "cuda0",
                 "--params-backend", "diffusion=cpu")
    unet = by_module(p)["diffusion"]
    assert unet["params"] == "cpu" and unet["compute_source"] == "simulated, fa=on,conv_direct=on"


# --- the VAE decode, mappings, compute by size ---------------------------------------------

def test_vae_decode_retries_tiled_with_half_size_tiles_even_with_auto_fit_off(capsys, sd15):
    # "If a VAE decode fails, decoding retries with spatial tiling even when --auto-fit is off ...
    # Spatial retries use half-size tiles along each latent dimension": 1024 px is 128 latent
    # pixels a side, the retry's tiles 64, whose decode is sd-cli's at 512 px
    fa = Mode(True, False)
    weights = sum(c["params_bytes"] for c in by_module(fit_json(capsys, sd15, "--backend", "cpu")).values())
    half = compute_bytes("kl-f8", "vae", 512, 512, fa)
    budget = weights + max(half, compute_bytes("sd15", "unet", 1024, 1024, fa)) + 32 * MiB
    assert compute_bytes("kl-f8", "vae", 1024, 1024, fa) > budget - weights
    p = fit_json(capsys, sd15, "--device", f"CUDA0={budget + 512 * MiB}B", "--ram", "64GiB", "--auto-fit", "off",
                 "-W", "1024", "-H", "1024", "--flash-attn", "on", "--conv-direct", "off")
    assert p["verdict"] == "fits with VAE tiling"
    assert by_module(p)["vae"]["compute_reserve_bytes"] == half
    assert p["flags"].endswith("--vae-tiling --vae-tile-size 64x64")


# An LTX-2 checkpoint as far as sd-cli's version detection and the VAE's layout go: the
# AdaLN-single timestep embedder (src/model_loader.cpp:537 -> VERSION_LTXAV) and the causal
# video VAE's conv_in and latent statistics (src/model/vae/ltx_vae.hpp), under the single file's "vae."
LTX2_PROBE = {
    "model.diffusion_model.adaln_single.emb.timestep_embedder.linear_1.bias": ("F32", (3840,)),
    "model.diffusion_model.patchify_proj.weight": ("BF16", (3840, 128)),
    "vae.decoder.conv_in.conv.weight": ("BF16", (1024, 128, 3, 3, 3)),
    "vae.decoder.conv_in.conv.bias": ("BF16", (1024,)),
    "vae.per_channel_statistics.mean-of-means": ("BF16", (128,)),
}


def _args(order):
    return [t.args for t in order]


def test_video_decoders_that_tile_in_time_retry_temporal_first_then_add_spatial(tmp_path):
    # "supported video decoders try temporal tiling first and can then add spatial tiling. Spatial
    # retries use half-size tiles along each latent dimension." In the pinned source the one such
    # decoder is LTX-2's: src/stable-diffusion.cpp:3070 prefers temporal tiling for a video decode
    # whose first-stage model is an LTXVideoVAE (built for VERSION_LTXAV, :1438-1439);
    # src/core/backend_fit.cpp:367-372 then sets temporal_tiling and leaves `enabled` (spatial) as
    # it was; a spatially tiled decode runs each tile through the decoder's compute (vae.hpp:182-204),
    # which streams the frames when temporal tiling is on (ltx_vae.hpp:1449): spatial is added on
    # top. The retry tile is half the latent: 1024x576 px over the LTX VAE's 32 px per latent pixel
    # (vae.hpp:75-76) is 32x18, so 16x9.
    ltx2 = write_safetensors(tmp_path / "ltx2.safetensors", LTX2_PROBE)
    comps = read_components([ModelSource(str(ltx2))])
    assert family(comps[Kind.DIFFUSION]) == "ltx2"
    decoder = decoder_of(comps)
    assert decoder == Decoder(temporal=True, scale=32)
    temporal = ["--temporal-tiling"]
    assert _args(retry_order(decoder, 1024, 576)) == [
        temporal, temporal + ["--vae-tiling", "--vae-tile-size", "16x9"], temporal + ["--vae-tiling"]]
    # --vae-tiling given: the first decode is already spatially tiled; the one retry adds time
    assert _args(retry_order(decoder, 1024, 576, spatial_asked=True)) == [temporal + ["--vae-tiling"]]
    # a TAE decodes instead of the LTX VAE (:1501-1503): an ordinary decoder, spatial retries
    tae = write_safetensors(tmp_path / "tae.safetensors", {"decoder.layers.0.weight": ("F16", (64, 12, 3, 3))})
    assert not decoder_of(read_components([ModelSource(str(ltx2)), ModelSource(str(tae), FileRole.TAESD)])).temporal


def test_other_decoders_retry_spatially_only(tmp_path):
    # Wan's causal VAE is a video decoder without temporal tiling (wan_vae.hpp has none; the
    # preference at src/stable-diffusion.cpp:3070 is for LTXVideoVAE alone): backend_fit.cpp:373-382
    # switches spatial tiling on, half the latent (256 px / 8 = 32 -> 16) per seed 002; with
    # --vae-tiling already on there is nothing left to retry (:374-375).
    dit = write_safetensors(tmp_path / "wan_dit.safetensors", {n: ("F16", s) for n, s in wan_dit_tensors().items()})
    vae = write_safetensors(tmp_path / "wan_vae.safetensors", {n: ("BF16", s) for n, s in wan_vae_tensors().items()})
    comps = read_components([ModelSource(str(dit), FileRole.DIFFUSION_MODEL), ModelSource(str(vae), FileRole.VAE)])
    assert [family(c) for c in comps if c.params_bytes] == ["wan", "wan-vae"]
    decoder = decoder_of(comps)
    assert decoder == Decoder(temporal=False, scale=8)
    assert _args(retry_order(decoder, 256, 256)) == [["--vae-tiling", "--vae-tile-size", "16x16"], ["--vae-tiling"]]
    assert retry_order(decoder, 256, 256, spatial_asked=True) == ()


def test_an_ltx2_decode_that_does_not_fit_whole_is_planned_tiled_in_time(capsys, tmp_path):
    # The order above, planned up front: the VAE decode of 64x64 px x 41 frames, its parameters
    # beside it on CUDA0, on a budget of the VAE's weights there and a compute room between sd-cli's
    # whole decode (the corpus's 64x64x41 row) and its temporally tiled one
    row = {r["temporal_tiling"]: r["bytes"] for r in json.loads(CORPUS.read_text())["rows"]
           if r["family"] == "ltx2-vae" and (r["width"], r["height"], r["frames"]) == (64, 64, 41)}
    assert row[True] < row[False]
    path = write_ltx2(tmp_path / "ltx2.safetensors")
    args = ["--ram", "64GiB", "--auto-fit", "off", "--backend", "diffusion=cpu,te=cpu,vae=CUDA0",
            "--params-backend", "diffusion=cpu,te=cpu,vae=CUDA0", "-W", "64", "-H", "64", "--frames", "41"]
    roomy = fit_json(capsys, str(path), "--device", "CUDA0=64GiB", *args)
    weights = next(d["weights_bytes"] for d in roomy["per_device"] if d["name"] == "CUDA0")
    budget = weights + (row[True] + row[False]) // 2
    p = fit_json(capsys, str(path), "--device", f"CUDA0={budget + 512 * MiB}B", *args)
    assert p["verdict"] == "fits with VAE tiling"
    vae = by_module(p)["vae"]
    assert round(vae["compute_reserve_bytes"] / MiB, 2) == round(row[True] / MiB, 2)
    assert vae["compute_source"].endswith("temporal_tiling=on")
    assert "--temporal-tiling" in p["flags"] and "--vae-tiling" not in p["flags"]


def test_a_video_vae_without_figures_keeps_the_fixed_reserve(capsys, tmp_path):
    # LTX2_PROBE's VAE is not LTX-2's whole decoder, so nothing sizes it: sd-fit labels its figure
    # as seed 002's fixed 1 GiB reserve and plans no tiling it cannot show to help
    path = write_safetensors(tmp_path / "ltx2.safetensors", LTX2_PROBE)
    p = fit_json(capsys, str(path), "--device", "CUDA0=1GiB", "--ram", "64GiB", "--frames", "9")
    vae = by_module(p)["vae"]
    assert vae["compute_source"] == "fixed reserve"
    assert vae["compute_reserve_bytes"] == COMPUTE_RESERVE[Kind.VAE] == 1 * GiB
    assert "--temporal-tiling" not in p["flags"] and "--vae-tiling" not in p["flags"]


def test_mmap_mappings_count_full_file_size_once_per_device():
    # "With --mmap, device-backed mappings count toward these budgets at their full mapped-file
    # size, once per device buffer even when multiple parameter blocks share it": one 3 GiB file
    # holds the UNet (2 GiB) and the text encoder (0.5 GiB), both kept on an integrated GPU that
    # maps host memory -> 3 GiB, not 2.5 GiB nor 2 x 3 GiB
    igpu = gpu("Vulkan0", 8, discrete=False)
    fit = problem([comp(Kind.DIFFUSION, 2), comp(Kind.TE, 0.5)], [igpu])
    placements = (Placement(Kind.DIFFUSION, 2 * GiB, 0, ("Vulkan0",), Where.RESIDENT),
                  Placement(Kind.TE, GiB // 2, 0, ("Vulkan0",), Where.RESIDENT))
    assert device_needs(fit, placements)[0].weights_bytes == 2 * GiB + GiB // 2
    files = (MappedFile(3 * GiB, frozenset({Kind.DIFFUSION, Kind.TE})),)
    assert device_needs(replace(fit, mapped_files=files), placements)[0].weights_bytes == 3 * GiB
    # a discrete GPU copies the weights out of the mapping: its own bytes count
    cuda = replace(problem([comp(Kind.DIFFUSION, 2)], [gpu("CUDA0", 8)]), mapped_files=files)
    on_cuda = (Placement(Kind.DIFFUSION, 2 * GiB, 0, ("CUDA0",), Where.RESIDENT),)
    assert device_needs(cuda, on_cuda)[0].weights_bytes == 2 * GiB


def test_compute_depends_on_the_image_size(capsys, sd15):
    # "Offloading weights does not guarantee that every resolution or frame count will fit": the
    # compute buffers are sd-cli's at the size, so one card fits 512 px and not the largest sizes
    args = [sd15, "--device", "CUDA0=4GiB", "--ram", "64GiB", "--auto-fit", "off", "--flash-attn", "off",
            "--conv-direct", "off"]
    small, large = fit_json(capsys, *args), fit_json(capsys, *args, "-W", "1024", "-H", "1024")
    off = Mode(False, False)
    assert by_module(small)["diffusion"]["compute_reserve_bytes"] == compute_bytes("sd15", "unet", 512, 512, off)
    assert by_module(large)["diffusion"]["compute_reserve_bytes"] == compute_bytes("sd15", "unet", 1024, 1024, off)
    assert small["verdict"].startswith("fits") and large["verdict"] == "does not fit"


def test_auto_fit_places_with_the_fixed_initial_reserves(capsys, sd15):
    # "Initial compute reserves are estimates (2 GiB for diffusion and text encoders, 1 GiB for
    # VAE)": at 256 px the UNet's real buffer is far below 2 GiB, yet auto-fit keeps 2 GiB of
    # headroom: a budget of weights + 1.5 GiB sends the UNet's parameters off the card
    weights = fit_json(capsys, sd15, "--backend", "cpu")["components"][0]["params_bytes"]
    assert compute_bytes("sd15", "unet", 256, 256, Mode(True, True)) < GiB
    budget = weights + GiB + GiB // 2
    p = fit_json(capsys, sd15, "--device", f"CUDA0={budget + 512 * MiB}B", "--ram", "64GiB", "-W", "256", "-H", "256")
    assert by_module(p)["diffusion"]["params"] == "cpu"
    assert {Kind.DIFFUSION: 2 * GiB, Kind.TE: 2 * GiB, Kind.VAE: GiB} == COMPUTE_RESERVE


def test_actual_buffers_must_fit_the_capacity_checks(capsys, sd15):
    # "Actual segment weights, compute buffers and caches must still fit the runner's capacity
    # checks": the figures behind the verdict are the real buffers at the size, not the reserves
    p = fit_json(capsys, sd15, "--device", "CUDA0=8GiB", "--ram", "64GiB", "-W", "768", "-H", "768")
    cuda = next(d for d in p["per_device"] if d["name"] == "CUDA0")
    comps = by_module(p)
    assert cuda["compute_bytes"] == max(c["compute_reserve_bytes"] for c in comps.values())
    assert cuda["weights_bytes"] == sum(c["params_bytes"] for c in comps.values() if c["params"] == "CUDA0")
    assert cuda["need_bytes"] <= cuda["cap_bytes"] and p["verdict"] == "fits"


def test_auto_fit_keeps_compute_on_the_gpu_when_weights_do_not_fit():
    # "auto-fit does not change a component to CPU computation solely because its full weights
    # exceed VRAM": a 30 GiB DiT on a 12 GiB card computes there, its parameters in RAM
    fit = problem([comp(Kind.DIFFUSION, 30)], [gpu("CUDA0", 12)], ram_budget_gib=64)
    (p,) = greedy_fit(fit)
    assert p.compute == ("CUDA0",) and p.params is Where.CPU


def test_staging_room_for_the_largest_tensor_of_lower_priority_offloaded_components():
    # "higher-priority placements also leave staging space for the largest weight tensor of each
    # lower-priority offloaded component": 8 GiB - 2 GiB reserve leaves 6 GiB; a TE whose largest
    # tensor is 1 GiB makes the 5.5 GiB DiT leave 2 + 1 GiB, so it no longer fits
    small = problem([comp(Kind.DIFFUSION, 5.5), comp(Kind.TE, 9, 0.01)], [gpu("CUDA0", 8)], ram_budget_gib=64)
    big = problem([comp(Kind.DIFFUSION, 5.5), comp(Kind.TE, 9, 1)], [gpu("CUDA0", 8)], ram_budget_gib=64)
    assert greedy_fit(small)[0].params is Where.RESIDENT
    assert greedy_fit(big)[0].params is Where.CPU


# --- items the audit found partial ---------------------------------------------------------

def test_row_split_slices_only_block_matmul_weights(tmp_path):
    # "transformer-block matmul weights are allocated in the backend's row-split buffer type ...
    # Embeddings, normalization weights, biases and other non-block tensors stay in regular
    # buffers on the main device": 1-D block tensors stay on CUDA0
    tensors = (SdTensor("model.diffusion_model.double_blocks.0.img_attn.qkv.weight", 100 * MiB, n_dims=2),
               SdTensor("model.diffusion_model.double_blocks.0.img_attn.qkv.bias", 1 * MiB, n_dims=1),
               SdTensor("model.diffusion_model.double_blocks.0.img_attn.norm.key_norm.scale", 1 * MiB, n_dims=1),
               SdTensor("model.diffusion_model.img_in.weight", 10 * MiB, n_dims=2))
    dit = Component(Kind.DIFFUSION, sum(t.n_bytes for t in tensors), 100 * MiB, tensors)
    free = {"CUDA0": 10 * GiB, "CUDA1": 10 * GiB}
    rows = row_shares(dit, ("CUDA0", "CUDA1"), free, {"CUDA0": "CUDA", "CUDA1": "CUDA"})
    assert rows is not None
    assert [r.block_bytes for r in rows] == [50 * MiB, 50 * MiB]
    assert rows[0].other_bytes == 12 * MiB and rows[1].other_bytes == 0


def test_scratch_margin_512_mib_also_under_an_explicit_budget(capsys, tmp_path):
    # "Runtime capacity checks also leave 512 MiB of currently free device memory for backend
    # scratch buffers and pipelines, including with explicit backend assignments": an explicit
    # --max-vram equal to the free memory still loses 512 MiB
    model = write_safetensors(tmp_path / "m.safetensors",
                              {"model.diffusion_model.x.weight": ("F16", [1024, 1024 * 1024])})  # 2 GiB
    p = fit_json(capsys, str(model), "--device", "CUDA0=4GiB", "--max-vram", "CUDA0=4", "--ram", "64GiB",
                 "--auto-fit", "off")
    cuda = next(d for d in p["per_device"] if d["name"] == "CUDA0")
    assert cuda["cap_bytes"] == 4 * GiB - 512 * MiB


def test_flash_attn_aliases_and_the_last_occurrence_wins(capsys, sd15):
    # "--fa and --diffusion-fa ... Both aliases write the same mode string as --flash-attn; the last
    # occurrence of any of these options wins"
    def flags(*args):
        code = main(["sd-fit", sd15, "--backend", "cpu", "--ram", "64GiB", *args, "--format", "flags"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out.strip()

    assert flags("--fa").endswith("--flash-attn on")
    assert flags("--diffusion-fa").endswith("--flash-attn off,diffusion=on")
    assert flags("--fa", "--flash-attn", "off").endswith("--flash-attn off")
    assert flags("--flash-attn", "off", "--fa").endswith("--flash-attn on")
    assert flags("--fa", "--diffusion-fa").endswith("--flash-attn off,diffusion=on")
    assert last_flash_attn([("--diffusion-fa", None), ("--flash-attn", "auto,te=off")]) == "auto,te=off"
