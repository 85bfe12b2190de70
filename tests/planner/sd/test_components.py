"""Component sizes from headers: sum of loaded tensor bytes + 64 per tensor (backend_fit.cpp)."""
from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import BadInput
from planner.sd.components import classify, read_components
from planner.sd.roles import FileRole, Kind, ModelSource

OVERHEAD = 64  # bytes per tensor, stable-diffusion.cpp backend_fit.cpp estimate_components


def sizes(components):
    return {c.kind: (c.params_bytes, c.largest_tensor_bytes) for c in components}


def test_checkpoint_classified_by_name_prefix(st_file):
    path = st_file("sd.safetensors", {
        "model.diffusion_model.input_blocks.0.0.weight": ("F16", [1024, 512]),   # 1 MiB
        "model.diffusion_model.out.2.bias": ("F32", [4]),                         # 16 B
        "first_stage_model.decoder.conv_in.weight": ("F16", [512, 256]),         # 256 KiB
        "cond_stage_model.transformer.text_model.final_layer_norm.weight": ("F16", [768]),
        "conditioner.embedders.1.model.ln_final.weight": ("F32", [1280]),
        "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight": ("F16", [64, 64]),
        "betas": ("F32", [1000]),                 # unused (scheduler buffer)
        "model_ema.decay": ("F32", [1]),          # unused
        "lora_te_text_model.something": ("F16", [8]),  # matches no rule: ignored
    })
    got = sizes(read_components([ModelSource(str(path))]))
    assert got[Kind.DIFFUSION] == (1024 * 512 * 2 + OVERHEAD + 16 + OVERHEAD, 1024 * 512 * 2 + OVERHEAD)
    assert got[Kind.VAE] == (512 * 256 * 2 + OVERHEAD, 512 * 256 * 2 + OVERHEAD)
    te = [768 * 2, 1280 * 4, 64 * 64 * 2]
    assert got[Kind.TE] == (sum(te) + 3 * OVERHEAD, max(te) + OVERHEAD)


@pytest.mark.parametrize("name,kind", [
    ("model.diffusion_model.double_blocks.0.img_attn.qkv.weight", Kind.DIFFUSION),
    ("unet.conv_in.weight", Kind.DIFFUSION),
    ("first_stage_model.encoder.conv_in.weight", Kind.VAE),
    ("vae.decoder.conv_in.weight", Kind.VAE),
    ("tae.decoder.layers.0.weight", Kind.VAE),
    ("text_encoders.llm.model.layers.0.mlp.up.weight", Kind.TE),
    ("cond_stage_model.1.model.ln_final.weight", Kind.TE),
    ("te.text_model.embeddings.token_embedding.weight", Kind.TE),
    ("conditioner.embedders.0.transformer.text_model.final_layer_norm.bias", Kind.TE),
    ("text_encoder.encoder.layers.0.weight", Kind.TE),
    ("text_embedding_projection.weight", Kind.TE),
    ("foo.aggregate_embed.weight", Kind.TE),
    ("decoder.conv_in.weight", None),   # a bare VAE name is only known through --vae
    ("my_vae.x", None),                 # "vae." must be a prefix
])
def test_classification_rules(name, kind):
    assert classify(name) is kind


def test_separate_files_per_module(st_file):
    dit = st_file("flux.safetensors", {"double_blocks.0.img_attn.qkv.weight": ("BF16", [3072, 9216]),
                                       "final_layer.linear.weight": ("BF16", [3072, 64])})
    vae = st_file("ae.safetensors", {"decoder.conv_in.weight": ("F32", [512, 16, 3, 3])})
    t5 = st_file("t5.safetensors", {"encoder.block.0.layer.0.SelfAttention.q.weight": ("F8_E4M3", [4096, 4096]),
                                    # t5 embed_tokens is unused once prefixed (model_loader.cpp)
                                    "encoder.embed_tokens.weight": ("F16", [4096, 32128])})
    clip = st_file("clip_l.safetensors", {"text_model.final_layer_norm.weight": ("F16", [768])})
    got = sizes(read_components([ModelSource(str(dit), FileRole.DIFFUSION_MODEL),
                                 ModelSource(str(vae), FileRole.VAE), ModelSource(str(t5), FileRole.T5XXL),
                                 ModelSource(str(clip), FileRole.CLIP_L)]))
    qkv, final = 3072 * 9216 * 2 + OVERHEAD, 3072 * 64 * 2 + OVERHEAD
    assert got[Kind.DIFFUSION] == (qkv + final, qkv)
    assert got[Kind.VAE] == (512 * 16 * 9 * 4 + OVERHEAD,) * 2
    q = 4096 * 4096 * 2 + OVERHEAD  # F8 loads as F16
    assert got[Kind.TE] == (q + 768 * 2 + OVERHEAD, q)


def test_gguf_file(tmp_path):
    import gguf

    path = tmp_path / "flux-q8.gguf"
    w = gguf.GGUFWriter(str(path), "flux")
    w.add_tensor("double_blocks.0.img_mod.lin.weight", np.zeros((64, 256), dtype=np.float16))
    q8 = np.zeros((32, 2 * 34), dtype=np.uint8)  # Q8_0 rows: 64 values = 2 blocks of 34 bytes
    w.add_tensor("single_blocks.0.linear1.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (dit,) = [c for c in read_components([ModelSource(str(path), FileRole.DIFFUSION_MODEL)]) if c.params_bytes]
    f16, q8_bytes = 64 * 256 * 2 + OVERHEAD, 32 * 68 + OVERHEAD
    assert (dit.kind, dit.params_bytes, dit.largest_tensor_bytes) == (Kind.DIFFUSION, f16 + q8_bytes, f16)


def test_absent_components_are_zero(st_file):
    path = st_file("vae.safetensors", {"decoder.conv_in.weight": ("F16", [4])})
    got = sizes(read_components([ModelSource(str(path), FileRole.VAE)]))
    assert got[Kind.DIFFUSION] == (0, 0) and got[Kind.TE] == (0, 0) and got[Kind.VAE] == (8 + OVERHEAD,) * 2


def test_no_usable_tensors(st_file):
    path = st_file("lora.safetensors", {"lora_unet_down.weight": ("F16", [4])})
    with pytest.raises(BadInput, match="no diffusion, text-encoder or VAE tensors"):
        read_components([ModelSource(str(path))])


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match="no such model file"):
        read_components([ModelSource(str(tmp_path / "nope.safetensors"))])


def _bare_gguf(path, tensors):
    """A GGUF v3 with no metadata, as stable-diffusion.cpp's converter writes: F16 tensors only."""
    import struct

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    infos, offset = b"", 0
    for name, n in tensors:
        raw = name.encode()
        infos += struct.pack("<Q", len(raw)) + raw + struct.pack("<IQIQ", 1, n, 1, offset)  # 1 dim, F16
        offset += -(-n * 2 // 32) * 32
    body = head + infos
    pad = -len(body) % 32
    path.write_bytes(body + b"\0" * pad + b"\0" * offset)
    return str(path)


def test_gguf_without_metadata_from_sd_cpp_convert(tmp_path):
    path = _bare_gguf(tmp_path / "sd-convert.gguf", [("model.diffusion_model.out.2.weight", 64),
                                                      ("first_stage_model.decoder.conv_in.weight", 32)])
    got = sizes(read_components([ModelSource(path)]))
    assert got[Kind.DIFFUSION] == (64 * 2 + OVERHEAD,) * 2
    assert got[Kind.VAE] == (32 * 2 + OVERHEAD,) * 2


def test_hostile_gguf_is_still_refused(tmp_path):
    import struct

    path = tmp_path / "evil.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0))
    with pytest.raises(BadInput, match="hostile"):
        read_components([ModelSource(str(path))])
