"""planner.registry.candidates: a repository listing grouped into the models `choose` compares — no network
(a listing is plain data; the loopback tests are tests/cli/test_choose.py)."""
from __future__ import annotations

import pytest

from planner.core.errors import BadInput
from planner.registry import hub
from planner.registry.candidates import from_listing

COMMIT = "a" * 40
FILES = (
    "README.md", "Model-Q4_K_M.gguf", "Model-Q8_0.gguf", "Model-UD-Q4_K_XL.gguf",
    "BF16/Model-BF16-00002-of-00002.gguf", "BF16/Model-BF16-00001-of-00002.gguf",
    "mmproj-F16.gguf", "mmproj-BF16.gguf", "Model.imatrix.gguf", "imatrix_unsloth.gguf",
    "Q2_K/Model-Q2_K-00001-of-00003.gguf", "Q2_K/Model-Q2_K-00002-of-00003.gguf",   # a shard missing
)


def listing(files=FILES) -> hub.Listing:
    return hub.Listing(hub.RepoRef("hf", "org/Model-GGUF"), COMMIT, tuple(files))


def test_models_are_grouped_and_companions_are_not_models(net_sandbox):
    found = from_listing("hf://org/Model-GGUF", listing(), (), 40)
    assert [c.label for c in found.candidates] == ["Q4_K_M", "Q8_0", "Q4_K_XL", "BF16"]
    bf16 = found.candidates[-1]
    assert bf16.files == ("BF16/Model-BF16-00001-of-00002.gguf", "BF16/Model-BF16-00002-of-00002.gguf")
    assert bf16.location.endswith(f"/org/Model-GGUF/resolve/{COMMIT}/BF16/Model-BF16-00001-of-00002.gguf")
    assert [p.path for p in found.projectors] == ["mmproj-F16.gguf", "mmproj-BF16.gguf"]
    assert found.source == "org/Model-GGUF@aaaaaaaaaaaa"


def test_each_model_notes_the_projector_llama_cpp_pairs(net_sandbox):
    by_label = {c.label: c for c in from_listing("x", listing(), (), 40).candidates}
    # the closest in bits to the model's own quant (download.cpp find_best_sibling)
    assert by_label["Q8_0"].mmproj.endswith("/mmproj-F16.gguf")
    assert by_label["BF16"].mmproj.endswith("/mmproj-F16.gguf")   # the folder's parent; F16 listed first


def test_a_shared_quant_tag_is_told_apart_by_the_file_name(net_sandbox):
    files = ("a/Model-Q4_K_M.gguf", "b/Other-Q4_K_M.gguf")
    assert [c.label for c in from_listing("x", listing(files), (), 40).candidates] == ["Model-Q4_K_M",
                                                                                      "Other-Q4_K_M"]


def test_include_narrows_by_tag_or_path_glob(net_sandbox):
    labels = [c.label for c in from_listing("x", listing(), ("q4_*", "BF16/*"), 40).candidates]
    assert labels == ["Q4_K_M", "Q4_K_XL", "BF16"]
    with pytest.raises(BadInput, match="no model of org/Model-GGUF@aaaaaaaaaaaa matches --include IQ1_S; "
                                       "its quants: Q4_K_M, Q8_0, Q4_K_XL, BF16, Q2_K"):
        from_listing("x", listing(), ("IQ1_S",), 40)


def test_over_the_cap_says_how_to_narrow(net_sandbox):
    with pytest.raises(BadInput, match=r"holds 5 models to compare, more than the 3 .*--include"):
        from_listing("x", listing(), (), 3)


@pytest.mark.parametrize("files, said", [
    (("README.md", "model.safetensors"), "holds no GGUF file"),
    (("mmproj-F16.gguf", "x.imatrix.gguf"), "holds only companion files"),
])
def test_no_model_is_refused(net_sandbox, files, said):
    with pytest.raises(BadInput, match=said):
        from_listing("x", listing(files), (), 40)


def test_the_command_lines_default_cap_is_the_librarys():
    import inspect

    from planner.cli.choose import choose_cmd
    from planner.registry.candidates import MAX_CANDIDATES

    assert inspect.signature(choose_cmd).parameters["max_files"].default == MAX_CANDIDATES
