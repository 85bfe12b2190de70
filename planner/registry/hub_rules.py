"""Which files of a model repository llama.cpp's `-hf ORG/REPO[:QUANT]` loads: its rules, re-implemented.

The pinned llama.cpp (llama-cpp-python 0.3.36, commit 0c1e570) picks files by name alone, from the
repository's file list; `common/download.cpp` is cited by line below. These functions take that
list (paths relative to the repository root, in the order the listing gives them) and return paths:
no I/O, so the Hugging Face listing, a hub cache snapshot and a ModelScope listing all go through
the same rules.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# download.cpp:662 — with no quant tag, the first tag that names a file wins, in this order.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")

# download.cpp:647-652 — a .gguf whose file name holds one of these is a companion, never the model.
COMPANION_MARKERS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")

# download.cpp:610 — the multimodal projector sibling is found by this keyword.
MMPROJ_KEYWORD = "mmproj"

# download.cpp:720-726 — a repository holding this file at its root is a preset, not a model.
PRESET_FILE = "preset.ini"

# download.cpp:483-484: `NAME-00001-of-00003` and the quant tag after the last '-' or '.'
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class SplitInfo:
    """A GGUF path's split position and quant tag (download.cpp:475-510 get_gguf_split_info)."""

    prefix: str      # the path without `.gguf` and without `-0000i-of-0000N`; the tag is kept
    tag: str         # upper case; '' when the name carries none
    index: int = 1
    count: int = 1


@dataclass(frozen=True)
class Selection:
    """What llama.cpp would load from a repository: the model's files and the projector it notes."""

    primary: str                 # the model file (the first shard of a split model)
    shards: tuple[str, ...]      # every shard, first first; (primary,) for an unsplit model
    mmproj: str | None = None    # the best `mmproj` sibling, for the companion-model planner


def split_info(path: str) -> SplitInfo | None:
    """None for a path that is not a `.gguf` (download.cpp:488: such a file has no split info)."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path.removesuffix(".gguf"), 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def _leading_bits(tag: str) -> int:
    """The number a quant tag starts its digits with: Q4_K_M -> 4, BF16 -> 16, UD -> 0
    (download.cpp:512-522 extract_quant_bits, which std::stoi's from the first digit)."""
    m = _DIGITS.search(tag)
    return int(m.group()) if m else 0


def quant_bits(path: str) -> int:
    info = split_info(path)
    return _leading_bits(info.tag) if info else 0


def is_model_file(path: str) -> bool:
    """A .gguf that is not a companion by its file name (download.cpp:637-653 gguf_filename_is_model)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(marker in name for marker in COMPANION_MARKERS)


def _first_shard_or_whole(path: str) -> bool:
    info = split_info(path)
    return info is not None and (info.count <= 1 or info.index == 1)


def best_model(files: Sequence[str], tag: str = "") -> str | None:
    """The model file for a quant tag, or for none (download.cpp:655-693 find_best_model).

    The tag matches case-insensitively anywhere in the path when followed by '.' or '-' (so `Q4_K_M`
    finds `x-Q4_K_M.gguf` and `Q4_K_M/x-Q4_K_M-00001-of-00002.gguf`, and `Q4_K` finds neither);
    the first matching file in listing order wins, later shards of a split never do. With no tag the
    defaults are tried in turn, then the first model file of all; with a tag there is no fallback.
    """
    for t in ((tag,) if tag else DEFAULT_QUANTS):
        # the tag goes into the pattern as llama.cpp builds it (t + "[.-]"); a tag is [A-Za-z0-9_]
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_shard_or_whole(f):
                return f
    if not tag:
        for f in files:
            if is_model_file(f) and _first_shard_or_whole(f):
                return f
    return None


def split_files(files: Sequence[str], primary: str) -> tuple[str, ...]:
    """Every shard of `primary`'s split: same prefix, same count (download.cpp:524-540
    get_split_files), ordered by shard number."""
    info = split_info(primary)
    if info is None or info.count <= 1:
        return (primary,)
    shards = []
    for f in files:
        other = split_info(f)
        if other is not None and other.count == info.count and other.prefix == info.prefix:
            shards.append((other.index, f))
    return tuple(f for _, f in sorted(shards))


def best_sibling(files: Sequence[str], model: str, keyword: str, tag: str = "") -> str | None:
    """The companion GGUF whose path holds `keyword` that llama.cpp pairs with `model`
    (download.cpp:542-606 find_best_sibling).

    A candidate must sit in the model's directory or one above it. The deepest such directory wins;
    then a path naming `-TAG.` exactly (when a tag is given); then the quant closest in bits to the
    tag's, or to the model's own when no tag is given. Ties keep the earlier file.
    """
    model_bits = _leading_bits(tag.upper()) if tag else quant_bits(model)
    model_dirs = model.split("/")[:-1]
    best: str | None = None
    best_key: tuple[int, bool, int] | None = None
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        sib_dirs = f.split("/")[:-1]
        if len(sib_dirs) > len(model_dirs) or model_dirs[:len(sib_dirs)] != sib_dirs:
            continue
        depth = len(sib_dirs)
        exact = bool(tag) and f"-{tag.upper()}." in f.upper()
        diff = abs(quant_bits(f) - model_bits)
        if best_key is None or _better((depth, exact, diff), best_key):
            best, best_key = f, (depth, exact, diff)
    return best


def _better(cand: tuple[int, bool, int], best: tuple[int, bool, int]) -> bool:
    depth, exact, diff = cand
    b_depth, b_exact, b_diff = best
    return (depth > b_depth or (depth == b_depth and exact and not b_exact)
            or (depth == b_depth and exact == b_exact and diff < b_diff))


def available_quants(files: Sequence[str]) -> list[str]:
    """The quant tags of a repository's model files, first shards only, in listing order
    (as download.cpp:940-962 common_list_cached_models names them)."""
    tags: list[str] = []
    for f in files:
        info = split_info(f)
        if info and info.index == 1 and info.tag and is_model_file(f) and info.tag not in tags:
            tags.append(info.tag)
    return tags


def gguf_files(files: Sequence[str]) -> list[str]:
    return [f for f in files if f.endswith(".gguf")]
