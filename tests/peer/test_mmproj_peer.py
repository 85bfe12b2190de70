"""The projector's estimate (planner/memory/mmproj.py) against the pinned llama-server's own load.

llama-server with the Gemma 3 270M target and shape-faithful sparse projectors projecting to the
270M's 640 (planner/synth/mmproj_factory.py):
- Gemma 3's (the full 27-layer SigLIP-So400m tower at 896 px),
- SmolVLM2's IDEFICS3 (12-layer SigLIP-B/16 at 512 px, pixel unshuffle by 4),
- LFM2-VL's LFM2 (a 16 x 16 position table interpolated to the 256-token warmup image, unshuffle by 2),
- Janus-Pro's (SigLIP-L/16 at 384 px, GELU aligner),
- Phi-4's (So400m/14, a 224 px warmup image, its 32 x 32 position table interpolated down),
- InternVL3-1B's (a class token, layer scales, pixel shuffle),
- Mistral Small 3.1's Pixtral (2-D RoPE, the patch merger, [IMG_BREAK] rows),
- Qwen2-VL-2B's (layer norms, quick GELU) and Qwen2.5-VL-3B's (32 layers, window attention, M-RoPE,
  a 1288 px warmup image), Qwen3-VL-2B's (a resized position table, fused qkv, three deepstack
  mergers concatenated);
under `-fit off` on 127.0.0.1: (a) two loopback rpc-servers with the projector on the first GPU-type
device, (b) the same with --no-mmproj-offload, (c) no devices at all, (d) -mmdev RPC1 -fa off (the
second server; the soft_max attention path), (e) -dev RPC1 (the projector follows the first -dev
device, common/arg.cpp), (f) --image-max-tokens 100 and (g) 64 with --image-min-tokens 16 on the host
(LFM2's warmup image shrinks to 320 and 256 px; Gemma 3's stays). clip.cpp logs the projector after the target:
its backend, load_hparams' model size (every tensor's bytes) and one reserve_compute_meta line per
backend (planner/checking/llama.py parse_clip_log).

Weights must equal llama.cpp's to the MiB; compute must be within 3 % or 4 MiB and never more than
1 MiB below (tests/support/estimate_matrix.py compute_ok).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.checking.llama import parse_clip_log, rows_by_device, start_server, wait_ready
from planner.core.llama_tools import LOOPBACK, free_port, stop_process
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.mmproj import estimate_mmproj
from planner.synth.mmproj_factory import (
    glma_mmproj_spec,
    idefics3_mmproj_spec,
    internvl_mmproj_spec,
    janus_pro_mmproj_spec,
    kimik25_mmproj_spec,
    kimivl_mmproj_spec,
    lfm2_mmproj_spec,
    lfm2a_mmproj_spec,
    lightonocr_mmproj_spec,
    llava_mmproj_spec,
    meralion_mmproj_spec,
    minicpmv_mmproj_spec,
    musicflamingo_mmproj_spec,
    paddleocr_mmproj_spec,
    phi4_mmproj_spec,
    pixtral_mmproj_spec,
    qwen2a_mmproj_spec,
    qwen2vl_mmproj_spec,
    qwen3a_mmproj_spec,
    qwen3vl_mmproj_spec,
    qwen25vl_mmproj_spec,
    ultravox_mmproj_spec,
    voxtral_mmproj_spec,
    write_gemma3_mmproj,
    write_mmproj,
)
from tests.support.estimate_matrix import compute_ok, model_path

pytestmark = pytest.mark.peer

MIB = 2**20
TARGET_FLAGS = ["-c", "4096", "-fit", "off"]
CASES = {
    "on RPC0": ["{rpc}", "-ts", "1,1"],
    "--no-mmproj-offload": ["{rpc}", "-ts", "1,1", "--no-mmproj-offload"],
    "host only": [],
    "-mmdev RPC1 -fa off": ["{rpc}", "-ts", "1,1", "-mmdev", "RPC1", "-fa", "off"],
    "-dev RPC1": ["{rpc}", "-dev", "RPC1"],
    "--image-max-tokens 100": ["{rpc}", "-ts", "1,1", "--image-max-tokens", "100"],
    "host --image-max-tokens 64 --image-min-tokens 16": ["--image-max-tokens", "64", "--image-min-tokens", "16"],
}


PROJECTORS = ("gemma3", "idefics3", "lfm2", "janus_pro", "phi4", "internvl", "pixtral", "qwen2vl", "qwen25vl",
              "qwen3vl")


@pytest.fixture(scope="module")
def files(shapes_dir: Path) -> dict[str, tuple[Path, Path]]:
    target = model_path("gemma3-270m", shapes_dir)
    return {"gemma3": (target, write_gemma3_mmproj(shapes_dir, n_text_embd=640)),
            "idefics3": (target, write_mmproj(shapes_dir, idefics3_mmproj_spec(n_text_embd=640), "mmproj-idefics3")),
            "lfm2": (target, write_mmproj(shapes_dir, lfm2_mmproj_spec(n_text_embd=640), "mmproj-lfm2")),
            "janus_pro": (target, write_mmproj(shapes_dir, janus_pro_mmproj_spec(n_text_embd=640), "mmproj-janus")),
            "phi4": (target, write_mmproj(shapes_dir, phi4_mmproj_spec(n_text_embd=640), "mmproj-phi4")),
            "internvl": (target, write_mmproj(shapes_dir, internvl_mmproj_spec(n_text_embd=640), "mmproj-internvl")),
            "pixtral": (target, write_mmproj(shapes_dir, pixtral_mmproj_spec(n_text_embd=640), "mmproj-pixtral")),
            "qwen2vl": (target, write_mmproj(shapes_dir, qwen2vl_mmproj_spec(n_text_embd=640), "mmproj-qwen2vl")),
            "qwen3vl": (target, write_mmproj(shapes_dir, qwen3vl_mmproj_spec(n_text_embd=640), "mmproj-qwen3vl")),
            "qwen25vl": (target, write_mmproj(shapes_dir, qwen25vl_mmproj_spec(n_text_embd=640), "mmproj-qwen25vl"))}


def _argv(template: list[str], endpoints: list[str]) -> list[str]:
    out: list[str] = []
    for a in template:
        out += ["--rpc", ",".join(endpoints)] if a == "{rpc}" else [a]
    return out


def _server_log(bin_dir: Path, target: Path, mmproj: Path, flags: list[str], log_path: Path) -> str:
    port = free_port()
    argv = [str(bin_dir / "llama-server"), "-m", str(target), "-mm", str(mmproj), "--host", LOOPBACK,
            "--port", str(port), "-np", "1", "-v", *flags]
    proc = start_server(argv, log_path)
    try:
        wait_ready(proc, port, log_path)
    finally:
        stop_process(proc)
    return log_path.read_text(errors="replace")


# every projector under the placement cases; the image-token cases where they matter (LFM2) and one
# where they must not (Gemma 3)
TOKEN_CASES = ("--image-max-tokens 100", "host --image-max-tokens 64 --image-min-tokens 16")
PARAMS = [(p, c) for p in PROJECTORS for c in CASES if c not in TOKEN_CASES or p in ("gemma3", "lfm2")]


@pytest.mark.parametrize("projector, case", PARAMS, ids=[f"{p}: {c}" for p, c in PARAMS])
def test_projector_matches_llama_server(llama_tools, rpc_endpoints, files, tmp_path, projector, case):
    target, mmproj = files[projector]
    flags = TARGET_FLAGS + _argv(CASES[case], rpc_endpoints)
    clip = parse_clip_log(_server_log(llama_tools, target, mmproj, flags, tmp_path / "server.log"))
    assert clip is not None, "llama-server logged no projector load"
    theirs = rows_by_device(clip.buffers, {f"RPC{i}": ep for i, ep in enumerate(rpc_endpoints)})

    settings = resolve_settings(model_context(str(target)), parse_llama_flags([*flags, "-mm", str(mmproj)]))
    est = estimate_mmproj(settings)
    mine = {d.name: d for d in est.devices}
    assert f"{clip.n_nodes} nodes" in est.notes[0]
    assert ("enabled" if clip.flash_attn else "disabled") in est.notes[0]
    for row, kinds in theirs.items():
        assert row in mine, f"llama.cpp lists {row}; fitplan lists {sorted(mine)}"
        if "model" in kinds:
            assert abs(mine[row].model_bytes - kinds["model"]) < MIB, (row, mine[row].model_bytes, kinds["model"])
        assert compute_ok(mine[row].compute_bytes / MIB, kinds.get("compute", 0) / MIB), \
            (row, mine[row].compute_bytes / MIB, kinds.get("compute", 0) / MIB)
    for row, d in mine.items():   # nothing fitplan lists that llama.cpp has no buffer for
        assert d.total_bytes <= MIB or row in theirs, (row, d)


# --- projb: the audio encoders, MiniCPM-V, Kimi-VL / K2.5, PaddleOCR-VL, LLaVA, LightOnOCR --------------------
# Shape-faithful whisper-enc projectors (Whisper-large-v3's 32-layer encoder; planner/synth/mmproj_factory.py)
# projecting to the 270M's 640: Ultravox (frames stacked by 8, SwiGLU MLP), Qwen2-Audio (pooled, one
# linear layer), Voxtral (pooled and stacked by 4), Music Flamingo (pooled, F32 conv kernels), MERaLiON
# (stacked by 15, the gated adaptor), GLM-ASR (stacked by 4 after a norm, boi/eoi); Qwen3-ASR-1.7B's (qwen3a:
# 100-frame chunks through three conv2d, 24 layers, the type only in clip.audio.projector_type); LFM2-Audio's
# FastConformer (lfm2a: 17 layers, relative-position attention, no flash attention). clip.cpp warms them up
# on a 3000-frame clip whatever the image-token flags say, so only the placement cases run. MiniCPM-V 2.6's
# resampler (27-layer SigLIP at 448 px, 64 queries) warms up at its image_size, Kimi-VL at 16 x 16 merged
# tokens (LightOnOCR too: Pixtral's graph), PaddleOCR-VL at 28 x 28, LLaVA 1.5 at 336 px and Kimi-K2.5 at
# sqrt(image_max_pixels) = 1792 px: the same cases, except K2.5 without flash attention (16384 patches: a
# 16 GiB soft_max the test machine cannot hold).
AUDIO_SPECS = {"ultravox": ultravox_mmproj_spec, "qwen2a": qwen2a_mmproj_spec, "voxtral": voxtral_mmproj_spec,
               "musicflamingo": musicflamingo_mmproj_spec, "meralion": meralion_mmproj_spec,
               "glma": glma_mmproj_spec, "qwen3a": qwen3a_mmproj_spec, "lfm2a": lfm2a_mmproj_spec}
PROJB_SPECS = {**AUDIO_SPECS, "minicpmv": minicpmv_mmproj_spec, "kimivl": kimivl_mmproj_spec,
               "kimik25": kimik25_mmproj_spec, "paddleocr": paddleocr_mmproj_spec, "llava": llava_mmproj_spec,
               "lightonocr": lightonocr_mmproj_spec}
PROJB_PARAMS = [(p, c) for p in PROJB_SPECS for c in CASES
                if c not in TOKEN_CASES and (p, c) != ("kimik25", "-mmdev RPC1 -fa off")]


@pytest.fixture(scope="module")
def projb_files(shapes_dir: Path) -> dict[str, tuple[Path, Path]]:
    target = model_path("gemma3-270m", shapes_dir)
    return {p: (target, write_mmproj(shapes_dir, spec(n_text_embd=640), f"mmproj-{p}"))
            for p, spec in PROJB_SPECS.items()}


@pytest.mark.parametrize("projector, case", PROJB_PARAMS, ids=[f"{p}: {c}" for p, c in PROJB_PARAMS])
def test_projb_projector_matches_llama_server(llama_tools, rpc_endpoints, projb_files, tmp_path, projector, case):
    test_projector_matches_llama_server(llama_tools, rpc_endpoints, projb_files, tmp_path, projector, case)
