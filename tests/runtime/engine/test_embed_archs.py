"""The BERT-family encoders (bert, nomic-bert, jina-bert-v2, jina-bert-v3, modern-bert) on tiny files: no cache at
all (llama_model::create_memory gives them none, and llama-fit-params --fit-print prints a context of 0 for them),
and the graph against the pinned llama.cpp's figures on the very same files (llama-fit-params -v: "graph: nodes =
N", "CPU compute buffer size = X MiB"). llama-fit-params accepts neither --embedding nor --pooling, so its reserve
is the trunk without pooling (llm_graph_context::build_pooling returns early without cparams.embeddings)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.shapes_embed import BERT, JINA_BERT_V2, JINA_BERT_V3, MODERN_BERT, NOMIC_BERT, tiny_bert
from runtime.engine.runner import ModelRunner
from tests.support.reserve_checks import assert_reserve_equals

ARCHS = (BERT, NOMIC_BERT, JINA_BERT_V2, JINA_BERT_V3, MODERN_BERT)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Two blocks (modern-bert: five, windows of 64 in blocks 1, 2 and 4) of 128 wide, 4 heads of 32, n_ff 256,
    512 tokens of context."""
    root = tmp_path_factory.mktemp("embed")
    return {arch: tiny_bert(arch, n_layer=5 if arch == MODERN_BERT else 2).write(root / f"{arch}.gguf")[0]
            for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_no_layer_owns_a_cache(models: dict[str, Path], arch: str) -> None:
    facts = model_context(str(models[arch])).facts
    assert facts.known and not any(lf.has_kv for lf in facts.layers)
    est = estimate(str(models[arch]), ["-c", "512"])
    assert [d.context_bytes for d in est.devices] == [0] * len(est.devices)


# llama-fit-params -v on the files of `models` ("graph: nodes = N", "CPU compute buffer size = X MiB")
LLAMA_CPP_RESERVE = {
    BERT: {"-c 512": (74, 1.88), "-c 512 -fa off": (80, 6.51), "-c 512 -ub 128": (74, 0.38),
           "-c 512 -np 2": (74, 1.88)},
    NOMIC_BERT: {"-c 512": (62, 2.76), "-c 512 -fa off": (68, 7.01), "-c 512 -ub 128": (62, 0.60),
                 "-c 512 -np 2": (62, 2.76)},
    JINA_BERT_V2: {"-c 512": (70, 2.75), "-c 512 -fa off": (76, 6.50), "-c 512 -ub 128": (70, 0.59),
                   "-c 512 -np 2": (70, 2.75)},
    JINA_BERT_V3: {"-c 512": (68, 2.38), "-c 512 -fa off": (74, 7.01), "-c 512 -ub 128": (68, 0.50),
                   "-c 512 -np 2": (68, 2.38)},
    MODERN_BERT: {"-c 512": (125, 3.26), "-c 512 -fa off": (140, 8.01), "-c 512 -ub 128": (125, 0.63),
                  "-c 512 -np 2": (125, 3.26)},
}


@pytest.mark.parametrize(("arch", "flags"), [(a, f) for a, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(models: dict[str, Path], arch: str, flags: str) -> None:
    assert_reserve_equals(models[arch], flags, *LLAMA_CPP_RESERVE[arch][flags])
    assert estimate(str(models[arch]), flags.split()).compute_model == "simulated"


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_is_refused_by_name(models: dict[str, Path], arch: str) -> None:
    """The runtime sizes these graphs; running them is refused with the reason, not attempted."""
    runner = ModelRunner.load(str(models[arch]), parse_llama_flags(["-c", "512"]))
    with pytest.raises(BadInput, match=f"{arch}: the runtime sizes its graphs but does not run them"):
        runner.decode([1, 2, 3])
