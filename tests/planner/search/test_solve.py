"""The placement solver: hand-derived placements, and the DP against the MILP on small problems."""
from __future__ import annotations

import random

import pytest

from planner.search.solve import LayerDemand, Objective, Problem, Slot, solve_dp, solve_milp


def _layers(sizes: list[int], output: int, experts: list[int] | None = None, expert_read: float = 0.0):
    experts = experts or [0] * len(sizes)
    out = [LayerDemand(s, e, float(s - e), expert_read if e else 0.0) for s, e in zip(sizes, experts, strict=False)]
    return tuple(out + [LayerDemand(output, 0, float(output), 0.0)])


HOST = Slot("CPU", 10**9, 1.0, 0, 0.0)


def test_device_takes_the_longest_suffix_that_fits():
    # Three 10-byte layers and a 5-byte output; the device holds 26 bytes. The host takes a
    # prefix, the device the rest: output + 2 layers = 25 fits, + 3 layers = 35 does not.
    problem = Problem(_layers([10, 10, 10], 5), (HOST, Slot("D0", 26, 10.0, 0, 0.0)))
    a = solve_dp(problem)
    assert a.slot_of_layer == (0, 1, 1, 1)
    # time: layer 0 read on the host (10 B at 1 B/s) + 25 B on the device at 10 B/s
    assert a.seconds_per_token == pytest.approx(10 + 2.5)


def test_fixed_bytes_count_only_on_a_used_slot():
    # The device's compute buffer (4 B) leaves room for output + 2 layers (25 + 4 = 29 <= 30)
    problem = Problem(_layers([10, 10, 10], 5), (HOST, Slot("D0", 30, 10.0, 4, 0.0)))
    assert solve_dp(problem).slot_of_layer == (0, 1, 1, 1)
    # with 28 bytes only output + 1 layer fits (15 + 4 = 19; 25 + 4 = 29 > 28)
    problem = Problem(_layers([10, 10, 10], 5), (HOST, Slot("D0", 28, 10.0, 4, 0.0)))
    assert solve_dp(problem).slot_of_layer == (0, 0, 1, 1)


def test_faster_device_first_in_order_gets_the_most():
    # D0 (fast) and D1 (slow) each hold 20 bytes; four 10-byte layers, 0-byte output.
    # Order is host, D0, D1: the best is 2 layers on D0 and 2 on D1 (the host is slowest).
    slots = (HOST, Slot("D0", 20, 100.0, 0, 0.0), Slot("D1", 20, 10.0, 0, 0.0))
    a = solve_dp(Problem(_layers([10, 10, 10, 10], 0), slots))
    assert a.slot_of_layer == (1, 1, 2, 2, 2)
    # If D0 can hold everything, the slow device gets nothing (decode is faster on D0).
    slots = (HOST, Slot("D0", 100, 100.0, 0, 0.0), Slot("D1", 100, 10.0, 0, 0.0))
    assert solve_dp(Problem(_layers([10, 10, 10, 10], 0), slots)).slot_of_layer == (1, 1, 1, 1, 1)


def test_tie_between_equal_devices_goes_to_the_first():
    slots = (HOST, Slot("D0", 100, 10.0, 0, 0.0), Slot("D1", 100, 10.0, 0, 0.0))
    assert solve_dp(Problem(_layers([10, 10], 0), slots)).slot_of_layer == (1, 1, 1)


def test_experts_leave_the_device_in_whole_units():
    # Two MoE layers of 30 bytes, 20 of them experts; output 0; device budget 45.
    # All on the device needs 60: one layer's experts (20) must go to the host -> 40 fits.
    layers = _layers([30, 30], 0, experts=[20, 20], expert_read=2.0)
    a = solve_dp(Problem(layers, (HOST, Slot("D0", 45, 10.0, 0, 0.0))))
    assert a.slot_of_layer == (1, 1, 1)
    assert len(a.experts_on_host) == 1
    # without expert offload the best is to leave layer 0 on the host (30 <= 45)
    a = solve_dp(Problem(layers, (HOST, Slot("D0", 45, 10.0, 0, 0.0)), allow_expert_offload=False))
    assert a.slot_of_layer == (0, 1, 1) and not a.experts_on_host


def test_nothing_fits_returns_none():
    tiny_host = Slot("CPU", 5, 1.0, 0, 0.0)
    assert solve_dp(Problem(_layers([10, 10], 5), (tiny_host, Slot("D0", 5, 10.0, 0, 0.0)))) is None


def test_balance_evens_out_two_devices():
    # Four 10-byte layers, 0-byte output, two equal devices with room for all four each.
    # Fastest puts everything on D0 (tie goes first); balance splits 2 and 2.
    slots = (HOST, Slot("D0", 40, 10.0, 0, 0.0), Slot("D1", 40, 10.0, 0, 0.0))
    problem = Problem(_layers([10, 10, 10, 10], 0), slots)
    assert solve_dp(problem).slot_of_layer == (1, 1, 1, 1, 1)
    assert solve_dp(problem, Objective.BALANCE).slot_of_layer == (1, 1, 2, 2, 2)


@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_the_milp_optimum(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    expert = rng.choice([0, 40])
    layers = tuple(LayerDemand(rng.randint(60, 120) + expert, expert, rng.randint(40, 100), expert * 0.25)
                   for _ in range(n)) + (LayerDemand(rng.randint(0, 80), 0, 50.0, 0.0),)
    slots = (Slot("CPU", 10**6, 10.0, 0, 0.0),) + tuple(
        Slot(f"D{i}", rng.randint(100, 450), rng.choice([40.0, 100.0, 250.0]), rng.randint(0, 40), 0.01)
        for i in range(rng.randint(1, 3)))
    problem = Problem(layers, slots)
    dp, milp = solve_dp(problem), solve_milp(problem)
    assert (dp is None) == (milp is None)
    if dp is not None:
        assert dp.seconds_per_token == pytest.approx(milp.seconds_per_token, rel=1e-6)
