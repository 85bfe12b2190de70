"""`plan`: budgets hold under the estimate, the flags reproduce the placement, the extra decisions
(output matrix on the host, -ub, experts on the host) are taken when they fit more, and a
heterogeneous pair gets a faster split than llama.cpp's proportional default."""
from __future__ import annotations

import hashlib

import pytest

from planner.core.errors import InfeasiblePlacement
from planner.core.units import GiB, MiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.programs import Program
from planner.memory.estimate import estimate
from planner.model.costs import cost_table
from planner.registry.examples import resolve_model
from planner.search.result import PlanRequest, llama_argv
from planner.search.search import plan
from planner.search.solve import Objective
from planner.speed.throughput import predict_estimate
from planner.synth.gguf_factory import llama_spec, qwen3moe_spec
from tests.support.overhead import CUDA_MIB


@pytest.fixture(scope="module")
def gemma():
    return model_context(resolve_model("example:gemma3-270m"))


def rpc(name: str, free: int, port: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, free, free, 0, 0, 0, endpoint=f"127.0.0.1:{port}")


def gpu(name: str, free: int, bandwidth: float) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, free, free, int(bandwidth), int(50e12), int(25e9))


HOST = HostSpec(64 * GiB, 60 * GiB, int(60e9), "test host", int(1e12))


def within_budgets(result) -> bool:
    """Check the plan's flags with an independent estimate call (what llama-server allocates for them)
    against every budget."""
    est = estimate(result.estimate.model_path, parse_llama_flags(llama_argv(result)), result.inventory,
                   program=Program.SERVER)
    host = sum(d.total_bytes for d in est.devices if d.name in ("Host", "CPU_REPACK"))
    devices_ok = all(d.total_bytes <= result.budgets.devices[d.name] for d in est.devices
                     if d.name in result.budgets.devices)
    return devices_ok and host <= result.budgets.host_bytes


def test_two_100mib_devices_hold_every_layer_at_the_training_context(gemma):
    # llama.cpp's --fit offloads nothing here (the 262144 x 512 f32 logits alone are 512 MiB);
    # keeping the tied output matrix on the host and a smaller -ub puts all 18 layers on the devices.
    inv = Inventory((rpc("RPC0", 100 * MiB, 50052), rpc("RPC1", 100 * MiB, 50053)), HOST)
    result = plan(gemma, inv, PlanRequest(max_ctx=True), max_vram="RPC0=100MiB,RPC1=100MiB")
    assert result.n_ctx == 32768  # gemma3.context_length in the file's header
    assert result.flags.n_gpu_layers == 19  # 18 blocks + the output layer
    assert any("token_embd" in a.value for a in result.flags.override_args)
    assert result.flags.n_ubatch < 512
    assert within_budgets(result)


def test_flags_round_trip_and_name_every_decision(gemma):
    inv = Inventory((rpc("RPC0", 100 * MiB, 50052), rpc("RPC1", 100 * MiB, 50053)), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=4096), max_vram="RPC0=100MiB,RPC1=100MiB")
    argv = llama_argv(result)
    for flag in ("--rpc", "-dev", "-ngl", "-ts", "-c", "-fit", "-sm"):
        assert flag in argv
    assert argv[argv.index("-c") + 1] == "4096"
    assert sum(int(x) for x in argv[argv.index("-ts") + 1].split(",")) == int(argv[argv.index("-ngl") + 1])


def test_plan_figures_are_the_estimate_of_its_flags(gemma):
    inv = Inventory((gpu("CUDA0", 2 * GiB, 500e9),), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=8192))
    again = estimate(gemma, result.flags, inv, program=Program.SERVER)
    assert again.devices == result.estimate.devices
    assert result.estimate.program is Program.SERVER


def test_the_output_device_holds_no_whole_ubatch_of_logits(gemma):
    # llama-server reserves one output row per slot (server_output_limits: -np 1, no draft), where
    # llama-fit-params reserves n_batch: 262144 x 512 f32 logits = 512 MiB on the output device
    inv = Inventory((gpu("CUDA0", 2 * GiB, 500e9),), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=8192))
    assert result.flags.n_ubatch == 512 and result.flags.n_parallel == 1
    logits = 262144 * 512 * 4
    dry = estimate(gemma, result.flags, inv)
    assert dry.device("CUDA0").compute_bytes >= logits
    assert result.estimate.device("CUDA0").compute_bytes < logits / 8


def test_infeasible_names_the_shortfall_and_what_would_fit(gemma):
    tiny_host = HostSpec(600 * MiB, 600 * MiB, int(60e9), "tiny", 0)
    with pytest.raises(InfeasiblePlacement) as err:
        plan(gemma, Inventory((), tiny_host), PlanRequest(n_ctx=32768), ram="300MiB", what_would_fit=True)
    assert "Host needs a budget of" in str(err.value)
    assert err.value.exit_code == 1
    assert err.value.shortfalls and err.value.shortfalls[0].device == "Host"
    assert err.value.shortfalls[0].budget_bytes == 300 * MiB < err.value.shortfalls[0].need_bytes


def test_heterogeneous_pair_beats_the_proportional_split(tmp_path):
    # 24 GiB at 1 TB/s beside 8 GiB at 300 GB/s; an 8-layer model fits on the fast card alone.
    # llama.cpp without -ts splits by free memory (3:1); decode at batch 1 reads every byte once,
    # so every byte moved to the 300 GB/s card costs 3.3x more time: fitplan keeps all on CUDA0.
    [path] = llama_spec(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=2816, n_vocab=4096).write(
        tmp_path / "llama.gguf")
    ctx = model_context(str(path))
    inv = Inventory((gpu("CUDA0", 24 * GiB, 1000e9), gpu("CUDA1", 8 * GiB, 300e9)), HOST)
    best = plan(ctx, inv, PlanRequest(n_ctx=4096, n_ubatch=512))
    assert best.flags.tensor_split == (9.0, 0.0)
    proportional = estimate(ctx, parse_llama_flags(["-dev", "CUDA0,CUDA1", "-c", "4096", "-ngl", "all"]), inv)
    assert dict(proportional.layers)["CUDA1"]  # the default really splits
    slower = predict_estimate(ctx, cost_table(ctx.model, ctx.facts), proportional, inv)
    assert best.prediction.decode_tokens_s > slower.decode_tokens_s


def test_moe_experts_go_to_the_host_when_the_device_is_short(tmp_path):
    spec = qwen3moe_spec(n_layer=4, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=2,
                         n_ff_exp=512, n_vocab=2048)
    [path] = spec.write(tmp_path / "moe.gguf")
    ctx = model_context(str(path))
    experts_per_layer = sum(t.n_bytes for t in ctx.model.tensors if t.name.startswith("blk.0.") and "_exps" in t.name)
    inv = Inventory((gpu("CUDA0", 8 * GiB, 900e9),), HOST)
    everything = estimate(ctx, parse_llama_flags(["-dev", "CUDA0", "-c", "4096", "-ngl", "all"]), inv)
    # a device budget 1.5 layers of experts short of holding everything: whole layers of experts
    # (two of them) must move to the host, and every layer can stay on the device
    budget = everything.device("CUDA0").held_bytes - experts_per_layer * 3 // 2   # held: the overhead with the rows
    result = plan(ctx, inv, PlanRequest(n_ctx=4096, n_ubatch=512), max_vram=f"CUDA0={budget}B")
    assert result.flags.n_gpu_layers == 5  # every block and the output layer stay offloaded
    assert len(result.experts_on_host) >= 2
    assert within_budgets(result)


def test_context_objective_maximises_context(gemma):
    inv = Inventory((gpu("CUDA0", 1 * GiB + CUDA_MIB * 2**20, 500e9),), HOST)   # 1 GiB beside the overhead
    small = plan(gemma, inv, PlanRequest(n_ctx=4096))
    big = plan(gemma, inv, PlanRequest(objective=Objective.CONTEXT))
    assert big.n_ctx >= small.n_ctx
    assert big.n_ctx == 32768


def test_header_hash_covers_the_header_only(gemma):
    inv = Inventory((gpu("CUDA0", 2 * GiB, 500e9),), HOST)
    result = plan(gemma, inv, PlanRequest(n_ctx=4096))
    with open(gemma.model.path, "rb") as f:
        header = f.read(gemma.model.header_bytes)
    assert result.header_sha256 == hashlib.sha256(header).hexdigest()
    assert gemma.model.header_bytes < 16 * MiB  # not the 235 MiB of weights


def test_milp_solver_reaches_the_same_plan_as_the_dp(gemma):
    # Same budgets as the 100 MiB pair above: both solvers must find the same placement.
    inv = Inventory((rpc("RPC0", 100 * MiB, 50052), rpc("RPC1", 100 * MiB, 50053)), HOST)
    dp = plan(gemma, inv, PlanRequest(n_ctx=8192, n_ubatch=64), max_vram="RPC0=100MiB,RPC1=100MiB")
    milp = plan(gemma, inv, PlanRequest(n_ctx=8192, n_ubatch=64, solver="milp"), max_vram="RPC0=100MiB,RPC1=100MiB")
    assert milp.flags == dp.flags
    assert milp.prediction.decode_tokens_s == pytest.approx(dp.prediction.decode_tokens_s)
