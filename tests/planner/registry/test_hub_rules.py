"""llama.cpp's `-hf` file selection (common/download.cpp at the pinned build), on file lists written
out by hand. Each expected pick is the one the cited lines of download.cpp make."""
from __future__ import annotations

from planner.registry import hub_rules as r


def test_split_info_reads_shard_numbers_and_the_tag_after_the_last_separator():
    # download.cpp:482-510: strip .gguf, then -NNNNN-of-NNNNN, then the tag after the last '-' or '.'
    info = r.split_info("Q4_K_M/Model-7B-Q4_K_M-00002-of-00003.gguf")
    assert info == r.SplitInfo("Q4_K_M/Model-7B-Q4_K_M", "Q4_K_M", 2, 3)
    assert r.split_info("model.q8_0.gguf") == r.SplitInfo("model.q8_0", "Q8_0", 1, 1)
    assert r.split_info("README.md") is None
    # bits from the tag's first digits: Q4_K_M -> 4, BF16 -> 16, no digits -> 0 (download.cpp:512-522)
    assert [r.quant_bits(p) for p in ("m-Q4_K_M.gguf", "m-BF16.gguf", "m-IQ2_XXS.gguf", "m-UD.gguf")] == [4, 16, 2, 0]


def test_no_tag_means_q4_k_m_then_q8_0_then_the_first_model_file():
    # download.cpp:662: the defaults are tried in that order, whatever the listing order
    files = ["m-F16.gguf", "m-Q8_0.gguf", "m-Q4_K_M.gguf"]
    assert r.best_model(files) == "m-Q4_K_M.gguf"
    assert r.best_model(["m-F16.gguf", "m-Q8_0.gguf"]) == "m-Q8_0.gguf"
    # download.cpp:680-690: then the first model file; companions never count
    assert r.best_model(["mmproj-m-F16.gguf", "imatrix.gguf", "m-F16.gguf", "m-BF16.gguf"]) == "m-F16.gguf"
    assert r.best_model(["README.md", "mmproj-m-Q4_K_M.gguf"]) is None


def test_a_tag_matches_case_insensitively_before_a_dot_or_dash_and_never_falls_back():
    files = ["m-Q4_K_S.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf"]
    assert r.best_model(files, "q8_0") == "m-Q8_0.gguf"
    # "Q4_K" must be followed by '.' or '-': neither Q4_K_S nor Q4_K_M matches it
    assert r.best_model(files, "Q4_K") is None
    assert r.best_model(files, "Q2_K") is None


def test_a_split_model_is_found_by_its_first_shard_and_every_shard_listed_in_order():
    files = ["Q4_K_M/m-Q4_K_M-00002-of-00003.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00003.gguf",
             "Q4_K_M/m-Q4_K_M-00003-of-00003.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf"]
    primary = r.best_model(files, "Q4_K_M")
    assert primary == "Q4_K_M/m-Q4_K_M-00001-of-00003.gguf"      # download.cpp:671: only shard 1
    assert r.split_files(files, primary) == ("Q4_K_M/m-Q4_K_M-00001-of-00003.gguf",
                                             "Q4_K_M/m-Q4_K_M-00002-of-00003.gguf",
                                             "Q4_K_M/m-Q4_K_M-00003-of-00003.gguf")
    assert r.split_files(files, "Q8_0/m-Q8_0-00001-of-00002.gguf") == ("Q8_0/m-Q8_0-00001-of-00002.gguf",)
    assert r.split_files(["x.gguf"], "x.gguf") == ("x.gguf",)


def test_the_mmproj_sibling_is_the_deepest_then_closest_in_bits():
    # download.cpp:545-606: same directory or above it; deeper wins; then |bits - model bits|
    files = ["mmproj-F16.gguf", "vision/mmproj-Q8_0.gguf", "Q8_0/mmproj-F32.gguf", "Q8_0/mmproj-Q8_0.gguf",
             "Q8_0/m-Q8_0.gguf"]
    assert r.best_sibling(files, "Q8_0/m-Q8_0.gguf", "mmproj") == "Q8_0/mmproj-Q8_0.gguf"
    # a root-level model cannot take a projector from a subdirectory
    assert r.best_sibling(files, "m-Q4_K_M.gguf", "mmproj") == "mmproj-F16.gguf"
    # at equal depth the closest quant wins: Q4 model, F16 (diff 12) vs Q8_0 (diff 4)
    assert r.best_sibling(["mmproj-F16.gguf", "mmproj-Q8_0.gguf"], "m-Q4_K_M.gguf", "mmproj") == "mmproj-Q8_0.gguf"
    # ties keep the earlier file
    assert r.best_sibling(["mmproj-a-F16.gguf", "mmproj-b-F16.gguf"], "m-F16.gguf", "mmproj") == "mmproj-a-F16.gguf"
    assert r.best_sibling(["m-Q4_K_M.gguf"], "m-Q4_K_M.gguf", "mmproj") is None


def test_available_quants_name_first_shards_of_model_files():
    files = ["m-Q8_0.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf",
             "mmproj-m-F16.gguf", "README.md"]
    assert r.available_quants(files) == ["Q8_0", "Q4_K_M"]
