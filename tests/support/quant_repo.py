"""A model repository as publishers lay one out: twelve quantizations of one small Llama-shaped model
(two of them split into shards, in their own folders), an mmproj file and a README — sparse files
for the loopback hub fake (tests/support/fake_hub.py), used by the `fitplan choose` tests and bench.

Each quantization's tensor types follow llama-quantize's common mixes in spirit (the `_M` variants
keep ffn_down one type up); `general.file_type` is llama.cpp's for the name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, Keys, LlamaFileType
from gguf import GGMLQuantizationType as Q

from planner.synth.gguf_factory import ModelSpec, llama_spec
from planner.synth.mmproj_factory import gemma3_mmproj_spec

N_LAYER, N_EMBD, N_FF, N_VOCAB, N_CTX = 8, 1024, 2816, 32000, 32768


@dataclass(frozen=True)
class Quant:
    tag: str
    main: Q             # attention and FFN matrices
    down: Q             # ffn_down
    ftype: LlamaFileType
    shards: int = 1


QUANTS = (
    Quant("Q2_K", Q.Q2_K, Q.Q3_K, LlamaFileType.MOSTLY_Q2_K),
    Quant("Q3_K_M", Q.Q3_K, Q.Q4_K, LlamaFileType.MOSTLY_Q3_K_M),
    Quant("Q4_0", Q.Q4_0, Q.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    Quant("IQ4_XS", Q.IQ4_XS, Q.IQ4_XS, LlamaFileType.MOSTLY_IQ4_XS),
    Quant("Q4_K_S", Q.Q4_K, Q.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
    Quant("Q4_K_M", Q.Q4_K, Q.Q6_K, LlamaFileType.MOSTLY_Q4_K_M),
    Quant("Q5_K_S", Q.Q5_K, Q.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
    Quant("Q5_K_M", Q.Q5_K, Q.Q6_K, LlamaFileType.MOSTLY_Q5_K_M),
    Quant("Q6_K", Q.Q6_K, Q.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    Quant("Q8_0", Q.Q8_0, Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    Quant("F16", Q.F16, Q.F16, LlamaFileType.MOSTLY_F16, shards=2),
    Quant("BF16", Q.BF16, Q.BF16, LlamaFileType.MOSTLY_BF16, shards=3),
)
MMPROJ = "mmproj-F16.gguf"


def spec(q: Quant) -> ModelSpec:
    s = llama_spec(n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, n_vocab=N_VOCAB, attn_type=q.main, v_type=q.main,
                   ffn_type=q.main, down_type=q.down, embd_type=q.main, out_type=q.down)
    s.metadata[Keys.LLM.CONTEXT_LENGTH] = N_CTX
    s.metadata[Keys.General.FILE_TYPE] = int(q.ftype)
    return s


def bits_per_weight(q: Quant) -> float:
    """From the definition: 8 x the tensor bytes over the weights, from the spec's types and shapes."""
    n_bytes = n_weights = 0
    for _, qtype, shape in spec(q).tensors:
        block, size = GGML_QUANT_SIZES[qtype]
        count = 1
        for d in shape:
            count *= d
        n_bytes += count // block * size
        n_weights += count
    return 8 * n_bytes / n_weights


def repo_path(q: Quant, i: int = 1) -> str:
    """Where the repository keeps it: a split model in a folder of its own, as publishers do."""
    if q.shards == 1:
        return f"Model-{q.tag}.gguf"
    return f"{q.tag}/Model-{q.tag}-{i:05d}-of-{q.shards:05d}.gguf"


def write_repo(directory: Path, quants: tuple[Quant, ...] = QUANTS) -> dict[str, Path]:
    """Every file of the repository, by its path in the repository (written once per directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {"README.md": directory / "README.md"}
    files["README.md"].write_text("# Model-GGUF\n")
    for q in quants:
        paths = spec(q).write(directory / f"Model-{q.tag}.gguf", shards=q.shards)
        for i, p in enumerate(paths, start=1):
            files[repo_path(q, i)] = p
    [files[MMPROJ]] = gemma3_mmproj_spec(n_text_embd=N_EMBD).write(directory / MMPROJ)
    return files
