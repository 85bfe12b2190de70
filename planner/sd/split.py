"""Layer split of one module across a `&` device list (seed 002, "Multiple devices per module").

The module's transformer blocks go to the listed devices in contiguous ranges sized in
proportion to each device's free memory minus a ~2 GiB compute headroom; the first device also
holds every non-block tensor. Only diffusion and te split; for te, only the dominant text
encoder (t5xxl or the LLM — here: the te sub-encoder with the most bytes). A module with no
recognisable blocks falls back to its first device.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.core.units import GiB
from planner.sd.assign import SplitMode
from planner.sd.components import Component, SdTensor
from planner.sd.roles import Kind

# stable-diffusion.cpp keeps this much free per device for compute when splitting
# (src/core/layer_split_partition.cpp, compute_headroom_bytes).
SPLIT_HEADROOM_BYTES = 2 * GiB
# A row split gives each device at least an eighth of its free memory (stable-diffusion.cpp,
# tensor_split in the row-split setup of src/stable-diffusion.cpp).
ROW_MIN_FRACTION = 8
SPLITTABLE = (Kind.DIFFUSION, Kind.TE)
# Path segments that mark UNet stages, which are not split, and the block keywords, in the
# order sd.cpp's `layer_split_tensor_block_index` tries them. The keyword's rank orders block
# families (Flux: double_blocks before single_blocks).
UNET_SEGMENTS = ("input_blocks.", "output_blocks.", "middle_block.", "down_blocks.", "up_blocks.", "mid_block.")
BLOCK_KEYWORDS = ("transformer_blocks.", "joint_blocks.", "double_blocks.", "single_blocks.",
                  "blocks.", "block.", "layers.")


@dataclass(frozen=True)
class SplitRange:
    """A device's part of a split module. Layer split: blocks [first_block, end_block).
    Row split: a slice of every block's rows (first 0, end n), `block_bytes` its share."""

    device: str
    first_block: int  # index into the module's ordered block list; first == end: no blocks
    end_block: int
    n_blocks_total: int
    block_bytes: int
    other_bytes: int  # non-block tensors (first device only)
    mode: SplitMode = SplitMode.LAYER

    @property
    def total_bytes(self) -> int:
        return self.block_bytes + self.other_bytes


def _segments_at(name: str, segment: str) -> list[int]:
    """Positions where `segment` starts a dotted path segment of `name`."""
    out, pos = [], name.find(segment)
    while pos != -1:
        if pos == 0 or name[pos - 1] == ".":
            out.append(pos)
        pos = name.find(segment, pos + 1)
    return out


def block_key(name: str) -> tuple[int, int] | None:
    """(keyword rank, block number) of a transformer-block tensor, or None."""
    if any(_segments_at(name, s) for s in UNET_SEGMENTS):
        return None
    for rank, keyword in enumerate(BLOCK_KEYWORDS):
        starts = _segments_at(name, keyword)
        if not starts:
            continue
        rest = name[starts[0] + len(keyword):]
        digits = rest.split(".", 1)[0]
        if digits.isdigit():
            return rank, int(digits)
    return None


def _te_group(name: str) -> str:
    parts = name.split(".")
    return parts[1] if parts[0] == "text_encoders" and len(parts) > 1 else parts[0]


def _block_tensors(comp: Component) -> list[SdTensor]:
    """The tensors a split may move off the first device."""
    if comp.kind is not Kind.TE:
        return list(comp.tensors)
    sizes: dict[str, int] = {}
    for t in comp.tensors:
        sizes[_te_group(t.name)] = sizes.get(_te_group(t.name), 0) + t.n_bytes
    dominant = max(sizes, key=lambda g: sizes[g]) if sizes else ""
    return [t for t in comp.tensors if _te_group(t.name) == dominant]


def _blocks(comp: Component, matrices_only: bool = False) -> dict[tuple[int, int], int]:
    """Bytes per transformer block of the tensors a split may move off the first device; a row
    split moves only the blocks' matmul weights (`matrices_only`: tensors of two or more
    dimensions), its norms and biases stay on the main device."""
    blocks: dict[tuple[int, int], int] = {}
    candidates = {id(t) for t in _block_tensors(comp)} if comp.kind in SPLITTABLE else set()
    for t in comp.tensors:
        key = block_key(t.name) if id(t) in candidates and (t.n_dims >= 2 or not matrices_only) else None
        if key is not None:
            blocks[key] = blocks.get(key, 0) + t.n_bytes
    return blocks


def row_shares(comp: Component, devices: tuple[str, ...], free: dict[str, int],
               backends: dict[str, str]) -> tuple[SplitRange, ...] | None:
    """Row split (seed 002, "Row split"): block weights sliced across the devices in proportion
    to max(free - 2 GiB, free / 8) (stable-diffusion.cpp's tensor_split for the split buffer);
    everything else stays on the main device. None when sd.cpp would fall back to a layer
    split: devices from different backend registries, or no block weights. Seed 002: "Embeddings,
    normalization weights, biases and other non-block tensors stay in regular buffers on the main
    device": only the blocks' matmul weights (two or more dimensions) are sliced."""
    blocks = _blocks(comp, matrices_only=True)
    if len(devices) < 2 or not blocks or len({backends.get(d, "") for d in devices}) > 1:
        return None
    usable = [max(free[d] - SPLIT_HEADROOM_BYTES, free[d] // ROW_MIN_FRACTION) for d in devices]
    usable = [u if u > 0 else 1 for u in usable]
    block_total, n = sum(blocks.values()), len(blocks)
    shares = [block_total * u // sum(usable) for u in usable]
    shares[0] += block_total - sum(shares)  # rounding remainder: the main device
    other = comp.params_bytes - block_total
    return tuple(SplitRange(d, 0, n, n, share, other if i == 0 else 0, SplitMode.ROW)
                 for i, (d, share) in enumerate(zip(devices, shares, strict=True)))


def split_ranges(comp: Component, devices: tuple[str, ...], free: dict[str, int],
                 limits: dict[str, int] | None = None) -> tuple[SplitRange, ...]:
    """Contiguous block ranges per device; block b goes to the first device whose cumulative
    share exceeds b / n_blocks (llama.cpp's proportional layer-split rule). A device's share is
    its free memory minus the headroom, capped by its --max-vram budget (`limits`; seed 002:
    "--max-vram can still provide the per-device limits used by layer split")."""
    blocks = _blocks(comp)
    order = sorted(blocks)
    other = comp.params_bytes - sum(blocks.values())
    n = len(order)
    if len(devices) < 2 or n == 0:
        return (SplitRange(devices[0], 0, n, n, sum(blocks.values()), other),)
    limits = limits or {}
    weights = [max(min(free[d] - SPLIT_HEADROOM_BYTES, limits.get(d, free[d])), 0) for d in devices]
    total = sum(weights) or len(devices)
    weights = weights if sum(weights) else [1] * len(devices)
    cumulative, acc = [], 0
    for w in weights:
        acc += w
        cumulative.append(acc)
    owner = [next(i for i, c in enumerate(cumulative) if b * total < c * n) for b in range(n)]
    out = []
    for i, device in enumerate(devices):
        mine = [b for b in range(n) if owner[b] == i]
        first, end = (mine[0], mine[-1] + 1) if mine else (n, n)
        out.append(SplitRange(device, first, end, n, sum(blocks[order[b]] for b in mine), other if i == 0 else 0))
    return tuple(out)
