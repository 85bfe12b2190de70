"""Companions placed with the target: the arrangements tried, the flags they stand for, budgets
judged on every model's rows, and the swing `--explain` names."""
from __future__ import annotations

import pytest
from gguf import Keys

from planner.core.errors import BadInput
from planner.core.units import MiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import flags_to_argv, parse_llama_flags
from planner.memory.estimate import estimate
from planner.registry.examples import resolve_model
from planner.search.companion_plan import arrangements, companion_flags
from planner.search.result import Companions, PlanRequest, plan_argv
from planner.search.search import plan
from planner.synth.gguf_factory import add_tokenizer
from planner.synth.qwen3next_factory import qwen35_spec

GIB = 1024 * MiB


def _rpc(name: str, port: int, free: int = GIB) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, free, free, 0, 0, 0, endpoint=f"127.0.0.1:{port}")


HOST = HostSpec(16 * GIB, 12 * GIB, int(50e9), "test host", int(1e12))
PAIR = Inventory((_rpc("RPC0", 1), _rpc("RPC1", 2)), HOST)


@pytest.fixture(scope="module")
def gemma():
    return model_context(resolve_model("example:gemma3-270m"))


def test_arrangements_try_the_last_device_first_then_the_host():
    c = Companions(draft="d.gguf", mmproj="p.gguf")
    tried = [(a.draft_device, a.mmproj_device) for a in arrangements(c, PAIR)]
    places = ["RPC1", "RPC0", "none"]
    assert tried == [(d, m) for d in places for m in places]
    fixed = Companions(draft="d.gguf", draft_device="RPC0")
    assert [(a.draft_device, a.mmproj_device) for a in arrangements(fixed, PAIR)] == [("RPC0", None)]


def test_companion_flags_name_each_placement():
    base = parse_llama_flags(["-c", "4096"])
    argv = flags_to_argv(companion_flags(base, Companions(draft="d.gguf", draft_device="RPC1", draft_cache_type="q8_0",
                                                          mmproj="p.gguf", mmproj_device="none", loras=("a.gguf",))))
    assert argv == ["-c", "4096", "-md", "d.gguf", "-devd", "RPC1", "-ctkd", "q8_0", "-ctvd", "q8_0",
                    "--spec-type", "draft-simple", "-mm", "p.gguf", "--no-mmproj-offload", "--lora", "a.gguf"]
    on_device = flags_to_argv(companion_flags(base, Companions(mmproj="p.gguf", mmproj_device="RPC0")))
    assert on_device[-2:] == ["-mmdev", "RPC0"]


def test_plan_with_a_drafter_holds_every_model_within_budgets(gemma):
    path = gemma.model.path
    free = (420 + 512) * MiB   # 420 MiB budgets after the default 512 MiB device margin
    inv = Inventory((_rpc("RPC0", 1, free), _rpc("RPC1", 2, free)), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=8192, companions=Companions(draft=path)), with_explain=True)
    argv = plan_argv(result)
    assert argv[argv.index("-md") + 1] == path and "--spec-type" in argv
    # an independent estimate of the printed flags, every model's rows added, within every budget
    est = estimate(path, parse_llama_flags(argv[2:]), inv)
    assert [c.kind for c in est.companions] == ["draft"]
    for d in est.totals:
        if d.name in result.budgets.devices:
            assert d.total_bytes <= result.budgets.devices[d.name]
    assert sum(d.total_bytes for d in est.totals if d.name in ("Host", "CPU_REPACK")) <= result.budgets.host_bytes
    assert any(line.startswith("the drafter on ") for line in result.explain)


def test_a_device_the_inventory_lacks_is_refused(gemma):
    with pytest.raises(BadInput, match="--draft-device 'CUDA0'"):
        plan(gemma, PAIR, PlanRequest(n_ctx=4096, companions=Companions(draft=gemma.model.path, draft_device="CUDA0")))


def test_a_drafter_that_runs_the_targets_output_is_placed_where_the_output_is(gemma, tmp_path):
    """A DFlash drafter without an output matrix runs the target's (planner/memory/draft.py
    check_borrowed_output): placements that leave it away from the output layer are not plans, as
    llama.cpp would abort on them; the plan keeps the drafter where it reaches the output."""
    from planner.synth.draft_models import dflash_spec, vocab_metadata

    drafter = tmp_path / "dflash.gguf"
    dflash_spec(vocab_metadata(gemma.model)).write(drafter)
    free = (1024 + 512) * MiB
    inv = Inventory((_rpc("RPC0", 1, free), _rpc("RPC1", 2, free)), HOST)
    for pinned in (None, "RPC0", "RPC1"):
        companions = Companions(draft=str(drafter), draft_device=pinned, spec_type="draft-dflash")
        result = plan(gemma, inv, PlanRequest(n_ctx=4096, companions=companions))
        argv = plan_argv(result)
        # the printed command estimates without the refusal: the output matrix is on the drafter's device
        # or in host memory (a tied one follows -ot token_embd=CPU)
        assert [c.kind for c in estimate(gemma.model.path, parse_llama_flags(argv[2:]), inv).companions] == ["draft"]


# mtp: --spec-type draft-mtp without -md, planned with the target
@pytest.fixture(scope="module")
def qwen35_mtp(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / "qwen35moe-mtp.gguf"
    spec = qwen35_spec(moe=True, n_mtp=1, n_vocab=2048)
    add_tokenizer(spec, 2048, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.write(path)
    return model_context(str(path))


def test_plan_with_mtp_holds_the_mtp_context_within_budgets(qwen35_mtp):
    free = (24 + 512) * MiB   # 24 MiB budgets after the default 512 MiB device margin
    inv = Inventory((_rpc("RPC0", 1, free), _rpc("RPC1", 2, free)), HOST)
    companions = Companions(mtp=True, draft_cache_type="q8_0", draft_max=5)
    result = plan(qwen35_mtp, inv, PlanRequest(n_ctx=4096, companions=companions), with_explain=True)
    argv = plan_argv(result)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and "-md" not in argv
    assert argv[argv.index("-ctkd") + 1] == "q8_0" and argv[argv.index("--spec-draft-n-max") + 1] == "5"
    est = estimate(qwen35_mtp, parse_llama_flags(argv[2:]), inv)
    assert [c.kind for c in est.companions] == ["mtp"]
    assert sum(d.context_bytes for d in est.companions[0].devices) == 4096 * 2 * 2 * 64 // 32 * 34
    for d in est.totals:
        if d.name in result.budgets.devices:
            assert d.total_bytes <= result.budgets.devices[d.name]
    assert sum(d.total_bytes for d in est.totals if d.name in ("Host", "CPU_REPACK")) <= result.budgets.host_bytes
    assert any(line.startswith("the MTP draft context on ") for line in result.explain)


def test_mtp_with_a_drafter_or_without_an_mtp_block_is_refused(qwen35_mtp, gemma):
    with pytest.raises(BadInput, match="--mtp and --draft"):
        plan(qwen35_mtp, PAIR, PlanRequest(n_ctx=4096, companions=Companions(mtp=True, draft=gemma.model.path)))
    with pytest.raises(BadInput, match="no next-token-prediction block"):
        plan(gemma, PAIR, PlanRequest(n_ctx=4096, companions=Companions(mtp=True)))
