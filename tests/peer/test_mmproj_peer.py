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
  mergers concatenated), Gemma 4 E4B's vision tower (clamped linears, 2-D NEOX RoPE, a 3 x 3 pool) and the
  unified Gemma 4 models' transformer-less embedder, Gemma 3n's MobileNetV5-300M (with LFM2-1.2B's 2048-wide
  text model as the target), Llama 4's (a class token, 2-D RoPE, pixel shuffle, the adapter MLP), GLM-4.1V's
  (RMS norms, M-RoPE, a 1288 px warmup image, the conv patch merger and SwiGLU projector), Gemma 4's audio
  conformer (chunked local attention, a 3000-frame warmup clip) and the unified models' audio embedder, each
  alone in its file, and Gemma 4 E4B's file with both encoders (two clip contexts whose buffers add up);
under `-fit off` on 127.0.0.1: (a) two loopback rpc-servers with the projector on the first GPU-type
device, (b) the same with --no-mmproj-offload, (c) no devices at all, (d) -mmdev RPC1 -fa off (the
second server; the soft_max attention path), (e) -dev RPC1 (the projector follows the first -dev
device, common/arg.cpp), (f) --image-max-tokens 100 and (g) 64 with --image-min-tokens 16 on the host
(LFM2's warmup image shrinks to 320 and 256 px; Gemma 3's stays). clip.cpp logs the projector after the target:
its backend, load_hparams' model size (every tensor's bytes) and one reserve_compute_meta line per
backend (planner/running/tool_runs.py parse_clip_log).

Weights must equal llama.cpp's to the MiB; compute must be within 3 % or 4 MiB and never more than
1 MiB below (tests/support/estimate_matrix.py compute_ok).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.mmproj import estimate_mmproj
from planner.running.tool_runs import parse_clip_log, rows_by_device, start_server, wait_ready
from planner.synth.mmproj_factory import (
    gemma3_mmproj_spec,
    gemma3nv_mmproj_spec,
    gemma4_e4b_mmproj_spec,
    gemma4a_mmproj_spec,
    gemma4ua_mmproj_spec,
    gemma4uv_mmproj_spec,
    gemma4v_mmproj_spec,
    glm4v_mmproj_spec,
    glma_mmproj_spec,
    idefics3_mmproj_spec,
    internvl_mmproj_spec,
    janus_pro_mmproj_spec,
    kimik25_mmproj_spec,
    kimivl_mmproj_spec,
    lfm2_mmproj_spec,
    lfm2a_mmproj_spec,
    lightonocr_mmproj_spec,
    llama4_mmproj_spec,
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
    write_mmproj,
)
from planner.system.llama_tools import LOOPBACK, free_port, stop_process
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
              "qwen3vl", "gemma4v", "gemma4uv", "gemma3nv", "llama4", "glm4v", "gemma4a", "gemma4ua", "ultravox",
              "qwen2a", "voxtral", "musicflamingo", "meralion", "glma", "qwen3a", "lfm2a", "minicpmv", "kimivl",
              "kimik25", "paddleocr", "llava", "lightonocr")
# each projector's spec (planner/synth/mmproj_factory.py), and Gemma 4 E4B's file with both encoders (two clip
# contexts; not a projector type of its own)
SPECS = {"gemma3": gemma3_mmproj_spec, "idefics3": idefics3_mmproj_spec, "lfm2": lfm2_mmproj_spec,
         "janus_pro": janus_pro_mmproj_spec, "phi4": phi4_mmproj_spec, "internvl": internvl_mmproj_spec,
         "pixtral": pixtral_mmproj_spec, "qwen2vl": qwen2vl_mmproj_spec, "qwen25vl": qwen25vl_mmproj_spec,
         "qwen3vl": qwen3vl_mmproj_spec, "gemma4v": gemma4v_mmproj_spec, "gemma4uv": gemma4uv_mmproj_spec,
         "gemma3nv": gemma3nv_mmproj_spec, "llama4": llama4_mmproj_spec, "glm4v": glm4v_mmproj_spec,
         "gemma4a": gemma4a_mmproj_spec, "gemma4ua": gemma4ua_mmproj_spec, "ultravox": ultravox_mmproj_spec,
         "qwen2a": qwen2a_mmproj_spec, "voxtral": voxtral_mmproj_spec, "musicflamingo": musicflamingo_mmproj_spec,
         "meralion": meralion_mmproj_spec, "glma": glma_mmproj_spec, "qwen3a": qwen3a_mmproj_spec,
         "lfm2a": lfm2a_mmproj_spec, "minicpmv": minicpmv_mmproj_spec, "kimivl": kimivl_mmproj_spec,
         "kimik25": kimik25_mmproj_spec, "paddleocr": paddleocr_mmproj_spec, "llava": llava_mmproj_spec,
         "lightonocr": lightonocr_mmproj_spec, "gemma4_e4b": gemma4_e4b_mmproj_spec}
# the target and the width it projects to: the 270M's 640, except Gemma 3n's tower, as wide as its text model
TARGET = ("gemma3-270m", 640)
TARGETS = {"gemma3nv": ("lfm2-1.2b", 2048)}


@pytest.fixture(scope="module")
def files(shapes_dir: Path) -> dict[str, tuple[Path, Path]]:
    out = {}
    for p, spec in SPECS.items():
        target, n_text_embd = TARGETS.get(p, TARGET)
        mmproj = write_mmproj(shapes_dir, spec(n_text_embd=n_text_embd), f"mmproj-{p}")
        out[p] = (model_path(target, shapes_dir), mmproj)
    return out


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
# Kimi-K2.5 warms up 16384 patches: without flash attention a 16 GiB soft_max the test machine cannot hold
SKIPPED = {("kimik25", "-mmdev RPC1 -fa off")}
PARAMS = [(p, c) for p in (*PROJECTORS, "gemma4_e4b") for c in CASES
          if (c not in TOKEN_CASES or p in ("gemma3", "lfm2")) and (p, c) not in SKIPPED]


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

