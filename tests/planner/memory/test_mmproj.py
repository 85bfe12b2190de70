"""The projector's memory (planner/memory/mmproj.py) on sparse Gemma 3, IDEFICS3, LFM2, Janus-Pro, Phi-4,
InternVL, Pixtral, Qwen2.5-VL and Qwen3-VL projector files.

Expected figures are worked out here from the tensor shapes (weights: every tensor's bytes padded to
the 32-byte alignment) and the placement rules of the pinned common/arg.cpp and tools/mtmd/clip.cpp
clip_ctx; the compute figures are what the pinned llama-server logged (reserve_compute_meta,
tests/peer/test_mmproj_peer.py) for the same towers projecting to 640. Most tests here project to the
small text model's 128: the head is not in those graphs' peak, so the buffers are the same (checked:
equal to the 0.01 MiB llama.cpp prints); Pixtral's and Qwen3-VL's tests use a 640-wide text model.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import BadInput, FlagError
from planner.core.units import pad
from planner.gguf.reader import read_model
from planner.hardware.inventory import Backend
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import Device
from planner.llama.settings import resolve_settings
from planner.memory.mmproj import estimate_mmproj
from planner.synth.gguf_factory import gemma3_spec
from planner.synth.mmproj_factory import (
    gemma3_mmproj_spec,
    gemma4a_mmproj_spec,
    idefics3_mmproj_spec,
    internvl_mmproj_spec,
    janus_pro_mmproj_spec,
    kimik25_mmproj_spec,
    lfm2_mmproj_spec,
    phi4_mmproj_spec,
    pixtral_mmproj_spec,
    qwen2a_mmproj_spec,
    qwen3vl_mmproj_spec,
    qwen25vl_mmproj_spec,
    write_gemma3_mmproj,
    write_mmproj,
)
from runtime.engine.clip_hparams import UnsupportedProjector, read_clip_hparams
from runtime.engine.clip_reserve import reserve_projector

MiB = 2**20
RPC = ["--rpc", "127.0.0.1:50052,127.0.0.1:50053"]
N_TEXT = 128                       # the text model's n_embd (gemma3_spec's default)
E, FF, SIDE = 1152, 4304, 896      # SigLIP-So400m width, FFN, Gemma 3's image size


def weight_bytes(n_layer: int, n_text: int = N_TEXT) -> int:
    """Gemma 3's projector weights: F16 matrices, F32 embeddings and vectors."""
    per_layer = 4 * E * E * 2 + 4 * E * 4 + 4 * E * 4 + 2 * E * FF * 2 + FF * 4 + E * 4
    embeddings = 14 * 14 * 3 * E * 4 + E * 4 + E * (SIDE // 14) ** 2 * 4
    head = 2 * E * 4 + n_text * E * 2 + E * 4        # post_ln, mm.input_projection, mm.soft_emb_norm
    return n_layer * per_layer + embeddings + head


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[ModelContext, Path, Path]:
    d = tmp_path_factory.mktemp("mmproj")
    [text] = gemma3_spec(n_embd=N_TEXT).write(d / "text.gguf")
    small = write_gemma3_mmproj(d, "mmproj-2", n_text_embd=N_TEXT, n_layer=2)
    full = write_gemma3_mmproj(d, "mmproj-27", n_text_embd=N_TEXT)
    return model_context(str(text)), small, full


def _estimate(ctx: ModelContext, mmproj: Path, *argv: str):
    flags = parse_llama_flags([*argv, "-mm", str(mmproj)])
    return estimate_mmproj(resolve_settings(ctx, flags))


def _rows(est) -> dict[str, tuple[int, int]]:
    return {d.name: (d.model_bytes, d.compute_bytes) for d in est.devices}


def test_weights_are_every_tensor_of_the_file(files):
    ctx, small, _ = files
    est = _estimate(ctx, small)
    assert est.kind == "mmproj" and est.compute_model == "simulated"
    assert _rows(est)["Host"][0] == weight_bytes(2)


@pytest.mark.parametrize("argv, device", [
    ([], "Host"),                                   # no GPU-type device: the CPU backend
    (RPC, "RPC0"),                                  # the first GPU-type device (an rpc-server is one)
    (RPC + ["--no-mmproj-offload"], "Host"),
    (RPC + ["-mmdev", "none"], "Host"),
    (RPC + ["-mmdev", "RPC1"], "RPC1"),
    (RPC + ["-dev", "RPC1"], "RPC1"),               # arg.cpp: -mmdev defaults to the first -dev device
    (RPC + ["-dev", "none"], "Host"),
])
def test_placement(files, argv, device):
    ctx, small, _ = files
    rows = _rows(_estimate(ctx, small, *argv))
    assert rows[device][0] == weight_bytes(2)
    assert sum(m for m, _ in rows.values()) == weight_bytes(2)
    assert list(rows)[-1] == "Host"


def test_offloaded_projector_leaves_the_input_image_on_the_cpu(files):
    """The image input is a graph input, so the CPU's buffer holds just it: 896 x 896 x 3 f32."""
    ctx, small, _ = files
    rows = _rows(_estimate(ctx, small, *RPC))
    assert rows["Host"] == (0, SIDE * SIDE * 3 * 4)


@pytest.mark.parametrize("fa, compute", [("auto", 121.25 * MiB), ("off", 1132.00 * MiB)])
def test_full_tower_compute_is_llama_cpps(files, fa, compute):
    """27 layers at 896 px; the figures the pinned llama-server logged (flash attention on: 865 nodes,
    off: 919)."""
    ctx, _, full = files
    est = _estimate(ctx, full, *RPC, "-fa", fa)
    rows = _rows(est)
    assert rows["RPC0"] == (weight_bytes(27), compute)
    assert ("865 nodes" if fa == "auto" else "919 nodes") in est.notes[0]


def test_other_projector_types_are_refused(files, tmp_path):
    ctx, _, _ = files
    spec = gemma3_mmproj_spec(n_text_embd=N_TEXT, n_layer=1)
    spec.metadata[Keys.Clip.PROJECTOR_TYPE] = "minicpmv"
    [path] = spec.write(tmp_path / "minicpmv.gguf")
    with pytest.raises(UnsupportedProjector, match="minicpmv"):
        _estimate(ctx, path)


def test_idefics3_weights_and_compute(files, tmp_path):
    """SmolVLM2's projector (SigLIP-B/16 at 512 px, 12 layers, pixel unshuffle by 4): weights by hand,
    the CPU holding the 512 x 512 x 3 f32 input when offloaded, and the compute llama-server logged
    (21.00 MiB, 396 nodes; -fa off 60.00 MiB, 420 nodes)."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, idefics3_mmproj_spec(n_text_embd=N_TEXT), "idefics3")
    e, ff, side = 768, 3072, 512
    per_layer = 4 * e * e * 2 + 4 * e * 4 + 4 * e * 4 + 2 * e * ff * 2 + ff * 4 + e * 4
    weights = 12 * per_layer + 16 * 16 * 3 * e * 2 + e * 4 + e * (side // 16) ** 2 * 4 + 2 * e * 4 + e * 16 * N_TEXT * 2
    est = _estimate(ctx, path, *RPC)
    assert _rows(est) == {"RPC0": (weights, 21 * MiB), "Host": (0, side * side * 3 * 4)}
    assert "396 nodes" in est.notes[0]
    assert _rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"] == (weights, 60 * MiB)


def test_a_merge_that_does_not_divide_the_side_is_refused(files, tmp_path):
    """512 / 16 = 32 patches a side: a factor of 3 would need ggml_pad, which is not modelled."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, idefics3_mmproj_spec(n_text_embd=N_TEXT, n_layer=1, scale_factor=3), "pad")
    with pytest.raises(UnsupportedProjector, match="3x3 of 32x32"):
        _estimate(ctx, path)


def test_width_must_match_the_text_model(files, tmp_path):
    ctx, _, _ = files
    path = write_gemma3_mmproj(tmp_path, "wide", n_text_embd=2 * N_TEXT, n_layer=1)
    with pytest.raises(BadInput, match="n_embd"):
        _estimate(ctx, path)


def test_unknown_mmdev_is_a_flag_error(files):
    ctx, small, _ = files
    with pytest.raises(FlagError, match="RPC7"):
        _estimate(ctx, small, *RPC, "-mmdev", "RPC7")


def test_flash_attention_auto_follows_cudas_head_sizes(tmp_path):
    """-fa auto keeps flash attention where clip's backend takes the op: CUDA has kernels for 72-wide
    heads (SigLIP's 1152 / 16) but not for 144-wide ones (ggml-cuda/fattn.cu); the CPU takes both."""
    cuda = Device("CUDA0", Backend.CUDA, 128, 0, True)
    for n_head, on_cuda in ((16, True), (8, False)):
        spec = gemma3_mmproj_spec(n_text_embd=N_TEXT, n_layer=1, n_head=n_head)
        [path] = spec.write(tmp_path / f"heads-{n_head}.gguf")
        model = read_model(str(path))
        assert reserve_projector(model, cuda, "auto").flash_attn is on_cuda
        assert reserve_projector(model, None, "auto").flash_attn
        assert not reserve_projector(model, cuda, "off").flash_attn


@pytest.mark.parametrize("argv, side, compute", [
    ([], 512, 21.00 * MiB),                                  # 256 tokens: sqrt(256 x (16 x 2)^2) = 512 px
    (["--image-max-tokens", "100"], 320, 8.203125 * MiB),    # sqrt(100 x 32^2) = 320 px
    (["--image-max-tokens", "64", "--image-min-tokens", "16"], 256, 5.25 * MiB),   # the table's own 16 x 16
])
def test_lfm2_warmup_follows_the_token_limit(files, tmp_path, argv, side, compute):
    """LFM2-VL's projector warms up at the largest image its token limit admits (clip-model.h
    set_limit_image_tokens, 64..256 tokens; --image-max-tokens replaces 256; the minimum does not
    matter). Weights by hand; the CPU holds the side x side x 3 f32 input; compute as llama-server
    logged it (21.00, 8.20, 5.25 MiB)."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, lfm2_mmproj_spec(n_text_embd=N_TEXT), "lfm2")
    e, ff, hidden = 768, 3072, 2560
    per_layer = 4 * e * e * 2 + 4 * e * 4 + 4 * e * 4 + 2 * e * ff * 2 + ff * 4 + e * 4
    tower = 12 * per_layer + 16 * 16 * 3 * e * 2 + e * 4 + e * 16 * 16 * 4 + 2 * e * 4
    head = 2 * 4 * e * 4 + 4 * e * hidden * 2 + hidden * 4 + hidden * N_TEXT * 2 + N_TEXT * 4
    est = _estimate(ctx, path, *RPC, *argv)
    assert _rows(est) == {"RPC0": (tower + head, compute), "Host": (0, side * side * 3 * 4)}
    assert f"warmup image {side}x{side}" in est.notes[0] and len(est.notes) == 1


def test_image_tokens_leave_gemma3_as_it_is(files):
    ctx, small, _ = files
    plain, capped = _estimate(ctx, small, *RPC), _estimate(ctx, small, *RPC, "--image-max-tokens", "64")
    assert plain.devices == capped.devices
    assert "leave this projector's warmup graph as it is" in capped.notes[1]


def _tower(e: int, ff: int, n_layer: int, patch: int, n_pos: int) -> int:
    """A SigLIP tower: per layer four F16 e x e matrices, two F16 FFN matrices, F32 vectors; an F16
    patch kernel, F32 position table and post norm."""
    per_layer = 4 * e * e * 2 + 4 * e * 4 + 4 * e * 4 + 2 * e * ff * 2 + ff * 4 + e * 4
    return n_layer * per_layer + patch * patch * 3 * e * 2 + e * 4 + e * n_pos * 4 + 2 * e * 4


@pytest.mark.parametrize("spec, tower, side, compute, compute_off", [
    # Janus-Pro-1B's SigLIP-L/16: warmup at image_size, 384 px
    (janus_pro_mmproj_spec, _tower(1024, 4096, 24, 16, 24 * 24), 384, 15.75 * MiB, 29.25 * MiB),
    # Phi-4's So400m/14: set_warmup_n_tokens(16 x 16) -> 16 x 14 = 224 px whatever image_size (448) says
    (phi4_mmproj_spec, _tower(1152, 4304, 27, 14, 32 * 32), 224, 7.578125 * MiB, 8.5 * MiB),
])
def test_mlp_heads(files, tmp_path, spec, tower, side, compute, compute_off):
    """Two-layer MLP heads (mm.0 {e, n_text} and mm.1 / mm.2 {n_text, n_text}, biased): weights by
    hand, the side x side x 3 f32 input on the CPU, compute as llama-server logged it (Janus-Pro 15.75 /
    29.25 MiB, Phi-4 7.58 / 8.50 MiB with -fa auto / off)."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, spec(n_text_embd=N_TEXT), "mlp")
    e = read_clip_hparams(read_model(str(path))).n_embd
    head = e * N_TEXT * 2 + N_TEXT * 4 + N_TEXT * N_TEXT * 2 + N_TEXT * 4
    assert _rows(_estimate(ctx, path, *RPC)) == {"RPC0": (tower + head, compute), "Host": (0, side * side * 3 * 4)}
    assert _rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"] == (tower + head, compute_off)


def test_qwen25vl(files, tmp_path):
    """Qwen2.5-VL-3B's vision shape: warmup at 46 x 46 merged tokens = 46 x 14 x 2 = 1288 px whatever
    --image-max-tokens says; the CPU holds every graph input (the image, 4 M-RoPE ids per patch, the
    f32 n_pos x n_pos window mask, the two window orders, each padded to 32 bytes). Compute on the
    device as llama-server logged it: 704.79 MiB (-fa auto), 4871.57 MiB (-fa off)."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, qwen25vl_mmproj_spec(n_text_embd=N_TEXT), "qwen25vl")
    e, ff, side = 1280, 3420, 1288
    # the 3420-wide FFN biases (13680 bytes) take 13696 in the buffer: each tensor is 32-byte aligned
    per_layer = 4 * e * e * 2 + 4 * e * 4 + 2 * e * 4 + 2 * e * ff * 2 + 2 * pad(ff * 4, 32) + ff * e * 2 + e * 4
    merger = (4 * e) ** 2 * 2 + 4 * e * 4 + 4 * e * N_TEXT * 2 + N_TEXT * 4      # mm.0, mm.2
    weights = 32 * per_layer + 2 * 14 * 14 * 3 * e * 2 + e * 4 + merger          # + both kernels, post_ln
    n_pos = (side // 14) ** 2
    inputs = side * side * 3 * 4 + 4 * n_pos * 4 + n_pos * n_pos * 4 + 2 * pad(n_pos // 4 * 4, 32)
    est = _estimate(ctx, path, *RPC, "--image-max-tokens", "256")
    rows = _rows(est)
    assert rows["RPC0"][0] == weights and rows["Host"] == (0, inputs)
    assert abs(rows["RPC0"][1] - 704.79 * MiB) < MiB // 200
    assert "warmup image 1288x1288" in est.notes[0] and "leave this projector's warmup" in est.notes[1]
    assert abs(_rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"][1] - 4871.57 * MiB) < MiB // 200


def test_internvl(files, tmp_path):
    """InternVL3-1B's vision shape (InternViT-300M/14 at 448 px, a class token, layer scales, pixel
    shuffle by 2): weights by hand; compute as llama-server logged it (28.03 / 80.14 MiB)."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, internvl_mmproj_spec(n_text_embd=N_TEXT), "internvl")
    e, ff, side = 1024, 4096, 448
    per_layer = 4 * e * e * 2 + 4 * e * 4 + 4 * e * 4 + 2 * e * ff * 2 + ff * 4 + e * 4 + 2 * e * 4
    tower = 24 * per_layer + 14 * 14 * 3 * e * 2 + e * 4 + e * (1024 + 1) * 4 + e * 4    # + class_embd
    head = 2 * 4 * e * 4 + 4 * e * N_TEXT * 2 + N_TEXT * 4 + N_TEXT * N_TEXT * 2 + N_TEXT * 4
    rows = _rows(_estimate(ctx, path, *RPC))
    assert rows["RPC0"][0] == tower + head and rows["Host"] == (0, side * side * 3 * 4)
    assert abs(rows["RPC0"][1] - 28.03 * MiB) < MiB // 200
    assert abs(_rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"][1] - 80.14 * MiB) < MiB // 200


def test_pixtral(tmp_path):
    """Mistral Small 3.1's Pixtral projector, 640 wide as in the peer test (its head is in the peak):
    warmup at 16 x 16 merged tokens = 16 x 14 x 2 = 448 px whatever --image-max-tokens says; weights by
    hand (no biases); compute as llama-server logged it (64.34 / 86.34 MiB)."""
    n_text = 640
    [text] = gemma3_spec(n_embd=n_text).write(tmp_path / "text640.gguf")
    ctx = model_context(str(text))
    path = write_mmproj(tmp_path, pixtral_mmproj_spec(n_text_embd=n_text), "pixtral")
    e, ff, side = 1024, 4096, 448
    per_layer = 4 * e * e * 2 + 2 * e * 4 + 3 * e * ff * 2
    head = e * 4 + 4 * e * e * 2 + e * n_text * 2 + n_text * n_text * 2 + n_text * 4   # norm, merger, mm.1/2, break
    weights = 24 * per_layer + 14 * 14 * 3 * e * 2 + e * 4 + head                     # + the kernel, pre_ln
    est = _estimate(ctx, path, *RPC, "--image-max-tokens", "1024")
    rows = _rows(est)
    n_patches = (side // 14) ** 2     # the CPU holds the image and the row and column ids of the 2-D RoPE
    assert rows["RPC0"][0] == weights and rows["Host"] == (0, side * side * 3 * 4 + 2 * n_patches * 4)
    assert abs(rows["RPC0"][1] - 64.34 * MiB) < MiB // 200 and "warmup image 448x448" in est.notes[0]
    assert abs(_rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"][1] - 86.34 * MiB) < MiB // 200


def test_qwen3vl(tmp_path):
    """Qwen3-VL-2B's vision shape, 640 wide (160 per path: the merger and three deepstack layers): the
    1472 px warmup image (46 x 16 x 2); weights by hand; the CPU holds the image and the M-RoPE ids;
    compute as llama-server logged it (322.49 / 4728.07 MiB)."""
    [text] = gemma3_spec(n_embd=640).write(tmp_path / "text640.gguf")
    ctx = model_context(str(text))
    path = write_mmproj(tmp_path, qwen3vl_mmproj_spec(n_text_embd=640), "qwen3vl")
    e, ff, out, side = 1024, 4096, 160, 1472
    per_layer = 3 * e * e * 2 + 3 * e * 4 + e * e * 2 + e * 4 + 4 * e * 4 + 2 * e * ff * 2 + ff * 4 + e * 4
    deepstack = 2 * 4 * e * 4 + (4 * e) ** 2 * 2 + 4 * e * 4 + 4 * e * out * 2 + out * 4
    tower = 24 * per_layer + 3 * deepstack + 2 * 16 * 16 * 3 * e * 2 + e * 4 + e * 48 * 48 * 4 + 2 * e * 4
    merger = (4 * e) ** 2 * 2 + 4 * e * 4 + 4 * e * out * 2 + out * 4
    n_pos = (side // 16) ** 2
    rows = _rows(_estimate(ctx, path, *RPC))
    assert rows["RPC0"][0] == tower + merger and rows["Host"] == (0, side * side * 3 * 4 + 4 * n_pos * 4)
    assert abs(rows["RPC0"][1] - 322.49 * MiB) < MiB // 200
    assert abs(_rows(_estimate(ctx, path, *RPC, "-fa", "off"))["RPC0"][1] - 4728.07 * MiB) < MiB // 200


def test_deepstack_text_models_take_the_wider_projector(tmp_path):
    """mtmd compares the projector's width with llama_model_n_embd_inp: n_embd x (1 + n_deepstack_layers)
    for Qwen3-VL's text models (src/llama-hparams.cpp), here a 160-wide text model with 3 deepstack layers."""
    spec = gemma3_spec(n_embd=160)
    spec.metadata["{arch}.n_deepstack_layers"] = 3
    [text] = spec.write(tmp_path / "text-deepstack.gguf")
    path = write_mmproj(tmp_path, qwen3vl_mmproj_spec(n_text_embd=640, n_layer=6, deepstack=(1, 3, 5)), "q3")
    est = _estimate(model_context(str(text)), path)
    assert est.devices[-1].name == "Host" and est.devices[-1].model_bytes > 0


# the audio encoders
@pytest.mark.parametrize("spec", [qwen2a_mmproj_spec, gemma4a_mmproj_spec])
def test_audio_projector_estimate(files, tmp_path, spec):
    """A Qwen2-Audio (Gemma 4 audio) projector beside the text model: offloaded to RPC0 with the 3000 x 128
    f32 clip (1.46 MiB) on the CPU, the note naming the clip, and the image-token flags said to change nothing."""
    ctx, _, _ = files
    path = write_mmproj(tmp_path, spec(n_text_embd=N_TEXT, n_layer=1), spec.__name__)
    est = _estimate(ctx, path, *RPC, "--image-max-tokens", "64")
    rows = _rows(est)
    assert set(rows) == {"RPC0", "Host"} and rows["Host"][0] == 0 and rows["RPC0"][0] > 0
    assert rows["Host"][1] >= 3000 * 128 * 4
    assert "warmup clip of 3000 frames" in est.notes[0]
    assert "warmup clip of 3000 frames whatever" in est.notes[1]


def test_kimik25_token_limit_note(files, tmp_path):
    """Kimi-K2.5 without the pixel keys warms up at the --image-max-tokens limit: no note that the flags
    change nothing; with them (the converter's files) the warmup is fixed and the note says so."""
    ctx, _, _ = files
    for limit, noted in ((None, False), (4096, True)):
        spec = kimik25_mmproj_spec(n_text_embd=N_TEXT, n_layer=1, patch_limit=limit)
        path = write_mmproj(tmp_path, spec, f"k25-{limit}")
        est = _estimate(ctx, path, "--image-max-tokens", "256")
        assert ("448x448" if limit is None else "896x896") in est.notes[0]
        assert (len(est.notes) == 2) is noted
