"""`plan --verdict` (planner/search/verdict.py): one endpoint per device, one split, or the fastest
device with host offload, for N clients and for one stream. Expected figures are derived here from
the model's definition (a step reads the weights once and each sequence's KV, multiplies N tokens;
a boundary costs its hand-off latency plus the activation over the link)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.units import GiB, MiB
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.registry.examples import resolve_model
from planner.search.result import PlanRequest
from planner.search.verdict import BASE_PORT, Arrangement, relation, verdict
from planner.speed.step_model import Endpoint, StepTerms, cpu_shares, equal_load_tokens_s, step_seconds
from planner.speed.throughput import ACTIVATION_BYTES_PER_VALUE, LOCAL_SPLIT_LATENCY_S
from tests.support.overhead import CUDA_MIB

HOST = HostSpec(64 * GiB, 60 * GiB, int(60e9), "test host", int(1e12))
BW, FLOPS, LINK = 300e9, 50e12, 25e9


def gpu(name: str, free: int = 2 * GiB) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, free, free, int(BW), int(FLOPS), int(LINK))


def rpc(name: str, port: int, cpus: tuple[int, ...] = (), threads: int = 0,
        remote: Backend | None = None) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, 2 * GiB, 2 * GiB, int(BW), int(FLOPS), int(LINK),
                      endpoint=f"127.0.0.1:{port}", cpus=cpus, threads=threads, remote_backend=remote)


@pytest.fixture(scope="module")
def gemma():
    return model_context(resolve_model("example:gemma3-270m"))


def budgets(inv: Inventory, each: int) -> Budgets:
    return Budgets({d.name: each for d in inv.devices}, 50 * GiB)


def test_step_seconds_is_the_roofline_of_weights_once_kv_and_compute_per_sequence():
    inv = Inventory((gpu("CUDA0"),), HOST)
    terms = StepTerms({"CUDA0": int(3e9)}, {"CUDA0": int(1e9)}, {"CUDA0": 1e8}, {"CUDA0": 1e12}, 1e-3, 1,
                      ("stated",))
    # one sequence: memory (3 + 1) GB / 300 GB/s = 13.3 ms, compute 1 TFLOP / 50 TFLOPS = 20 ms: 20 ms + 1 ms
    assert step_seconds(terms, inv, 1) == pytest.approx(0.021)
    # four: memory (3 + 4) / 300 = 23.3 ms, compute 80 ms
    assert step_seconds(terms, inv, 4) == pytest.approx(0.081)
    # a memory-bound device: weights read once, so 4 sequences cost less than 4 steps
    light = StepTerms({"CUDA0": int(3e9)}, {"CUDA0": int(1e8)}, {"CUDA0": 1e7}, {"CUDA0": 1e9}, 0.0, 0, ())
    assert step_seconds(light, inv, 4) == pytest.approx((3e9 + 4e8) / BW)
    # the op nodes' kernels run once a step, however many sequences it carries: 2 ms at 1 and at 4
    launched = replace(light, kernel_s=2e-3)
    assert step_seconds(launched, inv, 4) - step_seconds(light, inv, 4) == pytest.approx(2e-3)
    assert step_seconds(launched, inv, 1) - step_seconds(light, inv, 1) == pytest.approx(2e-3)


def test_two_equal_devices_that_each_hold_the_model_endpoints_win_for_four_clients(gemma):
    inv = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    v = verdict(gemma, inv, budgets(inv, 1536 * MiB), PlanRequest(n_ctx=4096), n_clients=4)
    a, b, c = (v.option(x) for x in Arrangement)
    assert a.possible and b.possible and c.possible
    assert v.by_clients[0] is Arrangement.ENDPOINTS
    # two endpoints of two slots each; the aggregate is their sum
    assert [e.n_slots for e in a.endpoints] == [2, 2]
    assert a.clients_tokens_s == pytest.approx(sum(e.batch_tokens_s for e in a.endpoints))
    assert [e.devices for e in a.endpoints] == [("CUDA0",), ("CUDA1",)]
    assert b.endpoints[0].devices == ("CUDA0", "CUDA1") and b.endpoints[0].n_slots == 4
    # one stream: the split reads the same bytes at the same bandwidth, with one more boundary
    # (CUDA0 -> CUDA1): its hand-off latency plus the f32 activation over the 25 GB/s link
    boundary = LOCAL_SPLIT_LATENCY_S + gemma.facts.n_embd * ACTIVATION_BYTES_PER_VALUE / LINK
    assert 1 / b.stream_tokens_s - 1 / a.stream_tokens_s == pytest.approx(boundary, rel=1e-3)
    assert v.by_stream[0] in (Arrangement.ENDPOINTS, Arrangement.OFFLOAD)   # the model says: one device
    assert v.by_stream[-1] is Arrangement.SPLIT
    assert "fits one device" in v.not_helping[0]
    # (c): the model fits the fastest device, nothing is offloaded
    assert "nothing is offloaded" in c.note
    commands = v.commands()
    assert len(commands) == 2
    assert commands[0].endswith(f"--port {BASE_PORT}") and commands[1].endswith(f"--port {BASE_PORT + 1}")
    assert "-dev CUDA1" in commands[1] and "-np 2" in commands[1] and "-c 8192" in commands[1]


def test_one_client_uses_one_endpoint(gemma):
    inv = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    v = verdict(gemma, inv, budgets(inv, 1536 * MiB), PlanRequest(n_ctx=4096), n_clients=1)
    a = v.option(Arrangement.ENDPOINTS)
    assert len(a.endpoints) == 1 and a.clients_tokens_s == pytest.approx(a.stream_tokens_s)
    assert v.winner is not None and v.winner.arrangement is v.by_stream[0]


def test_a_model_that_fits_no_single_device_makes_endpoints_impossible_and_names_the_devices(gemma):
    # 200 MiB each: the 253 MiB model (and its compute) needs both devices
    inv = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    v = verdict(gemma, inv, budgets(inv, (200 + CUDA_MIB) * MiB), PlanRequest(n_ctx=4096), n_clients=4)   # + overhead
    a = v.option(Arrangement.ENDPOINTS)
    assert not a.possible
    assert "fits no single device" in a.impossible and "CUDA0" in a.impossible and "CUDA1" in a.impossible
    assert Arrangement.ENDPOINTS not in v.by_clients
    assert v.option(Arrangement.SPLIT).possible
    assert v.to_dict()["options"][0]["possible"] is False


def test_an_rpc_device_is_rpc0_of_its_own_endpoint(gemma):
    # llama.cpp numbers the rpc devices of one process from 0 in --rpc order
    inv = Inventory((rpc("RPC0", 50052), rpc("RPC1", 50053)), HOST)
    v = verdict(gemma, inv, budgets(inv, 1536 * MiB), PlanRequest(n_ctx=4096), n_clients=2)
    a = v.option(Arrangement.ENDPOINTS)
    second = a.endpoints[1]
    assert second.devices == ("RPC1",)
    argv = list(second.argv)
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:50053" and argv[argv.index("-dev") + 1] == "RPC0"
    assert "over the network" in v.not_helping[0]


def test_more_slots_than_the_kv_fits_is_named(gemma):
    # one slot of a 32768 context fits a 700 MiB budget; eight such slots do not
    inv = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    v = verdict(gemma, inv, budgets(inv, (700 + CUDA_MIB) * MiB), PlanRequest(n_ctx=32768), n_clients=16)
    assert not v.option(Arrangement.ENDPOINTS).possible
    assert any("more slots than" in n for n in v.not_helping)


def test_the_verdict_refuses_one_device_and_no_clients(gemma):
    from planner.core.errors import BadInput

    one = Inventory((gpu("CUDA0"),), HOST)
    with pytest.raises(BadInput, match="several devices"):
        verdict(gemma, one, budgets(one, GiB), PlanRequest(n_ctx=4096))
    two = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    with pytest.raises(BadInput, match="--clients"):
        verdict(gemma, two, budgets(two, GiB), PlanRequest(n_ctx=4096), n_clients=0)


def test_arrangements_within_five_percent_are_a_tie():
    assert relation(100.0, 96.0) == "≈" and relation(96.0, 100.0) == "≈"
    assert relation(100.0, 94.0) == ">" and relation(94.0, 100.0) == "<"


def test_the_printed_ranking_marks_ties_between_neighbours(gemma):
    """One stream on two equal devices: the split only adds a boundary (15 µs of a ~1 ms token), a tie."""
    inv = Inventory((gpu("CUDA0"), gpu("CUDA1")), HOST)
    v = verdict(gemma, inv, budgets(inv, 2 * GiB), PlanRequest(n_ctx=512), n_clients=1)
    text = v.ranking_text(clients=False)
    assert text == "(a) ≈ (c) ≈ (b)"   # (c) is (a) here: the model fits the fastest device, nothing offloaded
    assert f"ranking for one stream: {text}" in v.to_table()


def test_cpu_rpc_servers_on_overlapping_cpus_share_them_by_threads():
    pinned = Inventory((rpc("RPC0", 1, (0,), 1), rpc("RPC1", 2, (1,), 1), rpc("RPC2", 3, (0,), 1)), HOST)
    # RPC0 and RPC2 on core 0: one core for two threads, half each; RPC1 alone on core 1
    assert cpu_shares(pinned, ["RPC0", "RPC1", "RPC2"]) == {"RPC0": 0.5, "RPC1": 1.0, "RPC2": 0.5}
    assert cpu_shares(pinned, ["RPC0", "RPC1"]) == {"RPC0": 1.0, "RPC1": 1.0}
    free = Inventory(tuple(rpc(f"RPC{i}", i, (0, 1), 1) for i in range(3)), HOST)
    assert cpu_shares(free, ["RPC0", "RPC1", "RPC2"]) == pytest.approx(dict.fromkeys(["RPC0", "RPC1", "RPC2"], 2 / 3))
    # overlaps join transitively: {0,1} with {1,2} with {2,3}: four cores, 2 + 2 + 4 threads wanting them;
    # alone, the first two had 2 cores each and the third its 2 CPUs for 4 threads
    chain = Inventory((rpc("RPC0", 1, (0, 1), 2), rpc("RPC1", 2, (1, 2), 2), rpc("RPC2", 3, (2, 3), 4)), HOST)
    assert cpu_shares(chain, ["RPC0", "RPC1", "RPC2"]) == pytest.approx({"RPC0": 0.5, "RPC1": 0.5, "RPC2": 1.0})
    # unknown CPUs, or a server computing on a GPU: independent
    other = Inventory((rpc("RPC0", 1), rpc("RPC1", 2, (0,), 1, Backend.CUDA), rpc("RPC2", 3, (0,), 1)), HOST)
    assert cpu_shares(other, ["RPC0", "RPC1", "RPC2"]) == {"RPC0": 1.0, "RPC1": 1.0, "RPC2": 1.0}


def _endpoint(device: str, n_slots: int, batch: float) -> Endpoint:
    return Endpoint((device,), BASE_PORT, n_slots, (), batch / n_slots, batch, 1)


def test_an_equal_load_ends_with_its_slowest_client_and_a_finished_one_frees_its_cores():
    pinned = Inventory((rpc("RPC0", 1, (0,), 1), rpc("RPC1", 2, (1,), 1), rpc("RPC2", 3, (0,), 1)), HOST)
    eps = (_endpoint("RPC0", 2, 40.0), _endpoint("RPC1", 1, 20.0), _endpoint("RPC2", 1, 30.0))
    # all at once: RPC0's clients 40/2 * 0.5 = 10 tokens/s, RPC1's 20, RPC2's 30 * 0.5 = 15. A unit of
    # work each: RPC1 done at 1/20 (its core is its own: nothing changes), RPC2 at 1/15; then RPC0 has
    # core 0 alone: its clients, 1 - 10/15 = 1/3 behind, go at 20 and finish at 1/15 + 1/60 = 1/12.
    # Four clients' units in 1/12 s: 48 tokens/s (the sum of rates at the start would say 55)
    assert equal_load_tokens_s(eps, pinned) == pytest.approx(48.0)
    # no shared cores: N x the slowest client
    apart = Inventory((rpc("RPC0", 1), rpc("RPC1", 2), rpc("RPC2", 3)), HOST)
    assert equal_load_tokens_s(eps, apart) == pytest.approx(4 * 20.0)


def test_three_pinned_rpc_servers_on_two_cores_lower_the_endpoints_aggregate(gemma):
    # the bench's layout: rpc-server i on core i mod 2, one thread each
    pinned = Inventory(tuple(rpc(f"RPC{i}", 50052 + i, (i % 2,), 1) for i in range(3)), HOST)
    apart = Inventory(tuple(rpc(f"RPC{i}", 50052 + i) for i in range(3)), HOST)
    shared, alone = (verdict(gemma, inv, budgets(inv, 1536 * MiB), PlanRequest(n_ctx=512), n_clients=4,
                             n_past=36).option(Arrangement.ENDPOINTS) for inv in (pinned, apart))
    assert [e.devices for e in shared.endpoints] == [("RPC0",), ("RPC1",), ("RPC2",)]
    assert [e.cpu_share for e in shared.endpoints] == [0.5, 1.0, 0.5]
    assert "endpoints share host cores: RPC0 at 0.50, RPC2 at 0.50" in shared.note
    assert shared.clients_tokens_s == pytest.approx(equal_load_tokens_s(shared.endpoints, pinned))
    assert shared.clients_tokens_s < alone.clients_tokens_s
    assert shared.slowest_client_tokens_s == pytest.approx(min(e.client_tokens_s for e in shared.endpoints))
    # one stream runs on one endpoint: nothing shares its cores
    assert shared.stream_tokens_s == pytest.approx(alone.stream_tokens_s)
