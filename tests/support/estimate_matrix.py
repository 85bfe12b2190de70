"""The estimate accuracy matrix (tests/peer/test_estimate_peer.py, bench/bench_estimate_accuracy.py):
each model of planner/synth/shapes_common.py (and the Gemma example) under a list of llama.cpp flag sets,
compared with what llama-fit-params --fit-print prints (planner.running.tool_runs.fit_print).
"""
from __future__ import annotations

import shlex
from pathlib import Path

from planner.core.units import MiB
from planner.memory.estimate import CPU_REPACK, Estimate
from planner.registry.examples import resolve_model
from planner.synth.shapes_common import SHAPES, write_shape

# "{rpc}" becomes --rpc with two loopback rpc-servers (llama.cpp names them RPC0, RPC1).
COMMON_FLAGS: tuple[str, ...] = (
    "-c 4096",
    "-c 32768",
    "{rpc} -c 4096 -ts 1,1",
    "{rpc} -c 4096 -ts 3,1",
    "{rpc} -c 32768 -ts 1,1",
    "{rpc} -c 4096 -ts 1,1 -ngl {half}",
    "-c 4096 -ctk q8_0 -ctv q8_0",
    "{rpc} -c 4096 -ts 1,1 -ctk q8_0 -ctv q8_0",
    "{rpc} -c 4096 -ts 1,1 -ctk q4_0 -ctv q4_0 -fa on",
    "-c 4096 -np 4",
    "{rpc} -c 4096 -ts 1,1 -np 4",
    "-c 4096 -fa off",
    "{rpc} -c 4096 -ts 3,1 -fa off",
    "-c 4096 -ub 128",
    "{rpc} -c 4096 -ts 1,1 -ub 128",
)
# K and V of different types: llama.cpp refuses them on MLA caches (llama_init_from_model), so not
# for deepseek2-mla.
MIXED_CACHE = "{rpc} -c 4096 -ts 3,1 -ctk q8_0 -ctv f16"
EXTRA_FLAGS: dict[str, tuple[str, ...]] = {
    "gemma3-270m": ("-c 4096 --swa-full", "{rpc} -c 4096 -ts 1,1 --swa-full", MIXED_CACHE),
    "llama-8b": (r"{rpc} -c 4096 -ts 1,1 -ot blk\.1[0-9]\.ffn_down=CPU", MIXED_CACHE),
    "qwen3moe-30b-a3b": ("{rpc} -c 4096 -ts 1,1 -ncmoe 8", "{rpc} -c 4096 -ts 1,1 -ot exps=CPU",
                         "-c 4096 -cmoe", MIXED_CACHE),
    "granite-hybrid": (MIXED_CACHE,),
    "lfm2-1.2b": (MIXED_CACHE,),
    "qwen3next-80b-a3b": ("{rpc} -c 4096 -ts 1,1 -ncmoe 8", "{rpc} -c 4096 -ts 1,1 -ot exps=CPU", "-c 4096 -cmoe",
                          MIXED_CACHE),
    "deepseek2-mla": ("{rpc} -c 4096 -ts 1,1 -ncmoe 8", "{rpc} -c 4096 -ts 1,1 -ot exps=CPU"),
    "gemma2-9b": ("-c 4096 --swa-full", "{rpc} -c 4096 -ts 1,1 --swa-full"),
    "gpt-oss-20b": ("{rpc} -c 4096 -ts 1,1 -ncmoe 8", "{rpc} -c 4096 -ts 1,1 -ot exps=CPU", "-c 4096 -cmoe"),
}
N_LAYER: dict[str, int] = {"gemma3-270m": 18, "llama-8b": 32, "qwen3moe-30b-a3b": 48, "deepseek2-mla": 27,
                           "granite-hybrid": 40, "mistral-7b": 32, "qwen2-7b": 28, "qwen3-8b": 36, "gemma2-9b": 42,
                           "gpt-oss-20b": 24, "lfm2-1.2b": 16,
                           "qwen3next-80b-a3b": 48}
MODELS: tuple[str, ...] = ("gemma3-270m",) + tuple(SHAPES)


def matrix() -> list[tuple[str, str]]:
    """(model name, flag template) rows of the accuracy matrix."""
    return [(m, f) for m in MODELS for f in COMMON_FLAGS + EXTRA_FLAGS.get(m, ())]


def model_path(name: str, directory: Path) -> Path:
    if name == "gemma3-270m":
        return Path(resolve_model("example:gemma3-270m"))
    return write_shape(name, directory)


def expand(template: str, name: str, endpoints: list[str]) -> list[str]:
    text = template.replace("{rpc}", "--rpc " + ",".join(endpoints)).replace("{half}", str(N_LAYER[name] // 2))
    return shlex.split(text)


def compute_ok(mine_mib: float, theirs_mib: int, compute_model: str = "simulated") -> bool:
    """The tolerance for the compute column. A simulated figure (the runtime's reserve): within 3 %
    or 4 MiB of llama.cpp's, and never below it by more than 1 MiB (llama.cpp prints floor(MiB), so
    its true figure is in [theirs, theirs + 1)). The formula (architectures without a graph
    builder, planner/memory/analytic.py): within 10 % or 16 MiB."""
    if compute_model == "simulated":
        return abs(mine_mib - theirs_mib) <= max(4.0, 0.03 * theirs_mib) and mine_mib >= theirs_mib - 1.0
    return abs(mine_mib - theirs_mib) <= max(16.0, 0.10 * theirs_mib)


def assert_rows_match(est: Estimate, theirs: dict[str, tuple[int, int, int]]) -> None:
    """fitplan's estimate against llama.cpp's rows (device -> model, context, compute MiB as it prints
    them, floor(MiB)): the same devices in the same order, model and context equal to the MiB, compute
    within compute_ok's tolerance. CPU_REPACK is a row llama.cpp's --fit-print leaves out."""
    ours = {d.name: d for d in est.devices if d.name != CPU_REPACK}
    assert list(ours) == list(theirs)
    for device, (model_mib, context_mib, compute_mib) in theirs.items():
        mine = ours[device]
        assert (mine.model_bytes // MiB, mine.context_bytes // MiB) == (model_mib, context_mib), device
        assert compute_ok(mine.compute_bytes / MiB, compute_mib, est.compute_model), \
            (device, est.compute_model, round(mine.compute_bytes / MiB, 2), compute_mib)
