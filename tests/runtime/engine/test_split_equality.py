"""A model split over virtual devices computes exactly what it computes on one device.

Every backend runs the same numpy kernels and input copies move bytes, so any difference
would mean a split lost or reordered data: the tests compare logits with array_equal.
RPC endpoints are placeholders: the runtime makes virtual devices of them, nothing connects.
"""
from __future__ import annotations

import numpy as np
import pytest

from planner.llama.flags import parse_llama_flags
from planner.registry.examples import resolve_model
from runtime.engine.runner import ModelRunner

PROMPT = [2, 818, 5279, 529, 7001, 563, 506, 5279, 529]
RPC2 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002"]
RPC3 = ["--rpc", "127.0.0.1:50001,127.0.0.1:50002,127.0.0.1:50003"]

PLACEMENTS = {
    "two devices, all layers (pipeline parallel)": RPC2 + ["-ngl", "99"],
    "two devices, 10 layers, -ts 1,3": RPC2 + ["-ngl", "10", "-ts", "1,3"],
    "three devices, -ts 2,1,1": RPC3 + ["-ts", "2,1,1"],
    "two devices, -nkvo": RPC2 + ["-nkvo"],
    "two devices, FFNs of blocks 0-9 on the CPU": RPC2 + ["-ot", r"blk\.[0-9]\.ffn_.*=CPU"],
    "three devices, -fa off -nkvo": RPC3 + ["-fa", "off", "-nkvo", "-ngl", "12"],
}


def _run(flags: list[str]) -> tuple[np.ndarray, ModelRunner]:
    runner = ModelRunner.load(resolve_model("example:gemma3-270m"), parse_llama_flags(["-c", "1024", *flags]))
    prompt_logits = runner.decode(PROMPT, all_logits=True)
    gen = [runner.decode([int(np.argmax(prompt_logits[-1]))], all_logits=True)]
    gen.append(runner.decode([int(np.argmax(gen[-1][-1]))], all_logits=True))
    return np.concatenate([prompt_logits, *gen]), runner


@pytest.fixture(scope="module")
def single() -> dict[str, np.ndarray]:
    """Reference logits on the CPU alone, once with flash attention and once without."""
    return {"fa": _run(["-ngl", "0"])[0], "nofa": _run(["-ngl", "0", "-fa", "off"])[0]}


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_split_run_logits_equal_single_device(name: str, single: dict[str, np.ndarray]) -> None:
    flags = PLACEMENTS[name]
    logits, runner = _run(flags)
    reference = single["nofa" if "off" in flags else "fa"]
    assert logits.shape == (len(PROMPT) + 2, 262144)
    # the split run really was split: more than one backend computed something
    assert runner.steps[0].measurement.n_splits > 1
    assert np.array_equal(logits, reference)


def test_reserve_retries_without_pipeline_parallelism_when_it_does_not_fit():
    """llama-context.cpp sched_reserve: when the pipeline-parallel prompt reserve cannot allocate,
    llama.cpp makes a scheduler without it and reserves again; a budget between the two fits."""
    from dataclasses import replace

    from planner.api import as_inventory
    from planner.llama.context import model_context
    from planner.llama.flags import parse_llama_flags
    from planner.llama.settings import resolve_settings
    from runtime.engine.runner import ModelRunner

    ctx = model_context("example:gemma3-270m")
    inv = as_inventory(["RPC0=1GiB@127.0.0.1:1", "RPC1=1GiB@127.0.0.1:2"])
    flags = parse_llama_flags(["--rpc", "127.0.0.1:1,127.0.0.1:2", "-c", "4096", "-ngl", "99", "-ts", "1,1"])
    settings = resolve_settings(ctx, flags, inv)
    assert settings.placement.pipeline_parallel
    with_pp = ModelRunner.from_settings(settings, weights=False)
    without = ModelRunner.from_settings(replace(settings, placement=replace(settings.placement,
                                                                            pipeline_parallel=False)), weights=False)
    need_pp = with_pp.weight_bytes["RPC1"] + with_pp.kv_bytes["RPC1"] + with_pp.compute_bytes()["RPC1"]
    need = without.weight_bytes["RPC1"] + without.kv_bytes["RPC1"] + without.compute_bytes()["RPC1"]
    assert need < need_pp
    runner = ModelRunner.from_settings(settings, {"RPC1": (need + need_pp) // 2}, weights=False)
    assert not runner.pipeline_parallel
    assert runner.compute_bytes() == without.compute_bytes()
