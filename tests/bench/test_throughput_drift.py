"""bench_throughput.round_speeds and steady_rounds: the machine's speed per round taken out, worked by hand."""
from __future__ import annotations

from collections.abc import Iterable

import pytest

from bench.bench_throughput import (
    GEMMA,
    ROUND_ESTIMATE,
    STEADY,
    Placement,
    RoundSpeed,
    Row,
    noise,
    round_speeds,
    steady_rounds,
)
from planner.measuring.llama_bench import ESTIMATES, Timing

# three placements' steady figures: decode 10 / 20 / 30 tokens/s, prefill 100 / 200 / 300
STEADY_FIGURES = {"a": (10.0, 100.0), "b": (20.0, 200.0), "c": (30.0, 300.0)}


def _timing(tg: float, pp: float, stolen: float | None = None) -> Timing:
    return Timing(tg, pp, 128, (tg, tg), (pp, pp), stolen)


def _rounds(slowness: dict[str, list[float]]) -> dict[str, list[Timing]]:
    """Each placement's steady figures times its slowness in each round, decode and prefill alike."""
    return {name: [_timing(tg * x, pp * x) for x in slowness[name]] for name, (tg, pp) in STEADY_FIGURES.items()}


def _figures(timings: dict[str, list[Timing]]) -> dict[str, list[tuple[float, float]]]:
    return {name: [(t.tg_tokens_s, t.pp_tokens_s) for t in ts] for name, ts in timings.items()}


def _flat(pairs: Iterable[tuple[float, float] | RoundSpeed]) -> list[float]:
    """(decode, prefill) pairs or round speeds laid end to end: pytest.approx compares flat sequences only
    (pytest 9 refuses nested ones), and a RoundSpeed inside approx would be compared exactly."""
    flat: list[float] = []
    for pair in pairs:
        flat.extend((pair.tg, pair.pp) if isinstance(pair, RoundSpeed) else pair)
    return flat


def test_a_round_uniformly_slow_becomes_the_steady_figures():
    # round 2 runs every placement 20 % slow: a 10 / 8 / 10, b 20 / 16 / 20, c 30 / 24 / 30 (decode).
    # Each placement's median of rounds is its steady figure, so in round 2 every ratio is 0.8 (rounds 1 and
    # 3: 1.0), and the median of a round's ratios is that round's speed
    measured = _rounds({name: [1.0, 0.8, 1.0] for name in STEADY_FIGURES})
    speeds = round_speeds(measured.values())
    assert _flat(speeds) == pytest.approx(_flat([RoundSpeed(1.0, 1.0), RoundSpeed(0.8, 0.8), RoundSpeed(1.0, 1.0)]))
    steadied = steady_rounds(measured, speeds)
    for name, (tg, pp) in STEADY_FIGURES.items():
        assert _flat(_figures(steadied)[name]) == pytest.approx(_flat([(tg, pp)] * 3))
        # the samples are divided alike: round 2's (8, 8) of a are (10, 10) again
        assert steadied[name][1].tg_samples == pytest.approx((tg, tg))


def test_one_placement_slow_alone_stays_slow():
    # round 2 runs the machine 20 % slow and placement a another half slow on top: a 10 / 4 / 10, b 20 / 16 / 20,
    # c 30 / 24 / 30. Round 2's ratios are 0.4, 0.8, 0.8: their median is 0.8, the machine's, whatever a did
    measured = _rounds({"a": [1.0, 0.4, 1.0], "b": [1.0, 0.8, 1.0], "c": [1.0, 0.8, 1.0]})
    speeds = round_speeds(measured.values())
    assert _flat([speeds[1]]) == pytest.approx([0.8, 0.8])
    steadied = _figures(steady_rounds(measured, speeds))
    # a keeps its own slowness in round 2 (4 / 0.8 = 5, half its 10); b and c are steady again
    assert _flat(steadied["a"]) == pytest.approx(_flat([(10.0, 100.0), (5.0, 50.0), (10.0, 100.0)]))
    assert _flat(steadied["b"]) == pytest.approx(_flat([(20.0, 200.0)] * 3))
    # and with the machine steady, a alone slow moves no round's speed: round 2's ratios 0.5, 1, 1
    alone = _rounds({"a": [1.0, 0.5, 1.0], "b": [1.0] * 3, "c": [1.0] * 3})
    assert _flat([round_speeds(alone.values())[1]]) == pytest.approx([1.0, 1.0])


def test_the_calibration_counts_and_is_divided_alike():
    # round 2: placement a and calibration runs x, y 20 % slow, placements b and c steady. The placements alone
    # would say round 2 ran at the median of (0.8, 1, 1) = 1; the five runs of the round say 0.8, 0.8, 0.8, 1, 1
    # -> 0.8, and the calibration's runs and the placements are divided by that same 0.8
    bench = _rounds({"a": [1.0, 0.8, 1.0], "b": [1.0] * 3, "c": [1.0] * 3})
    calibration = {"x": [_timing(50.0, 500.0), _timing(40.0, 400.0), _timing(50.0, 500.0)],
                   "y": [_timing(60.0, 600.0), _timing(48.0, 480.0), _timing(60.0, 600.0)],
                   "kept median": [_timing(7.0, 70.0)]}    # a file's median of rounds: says nothing of a round
    assert _flat([round_speeds(bench.values())[1]]) == pytest.approx([1.0, 1.0])
    speeds = round_speeds([*calibration.values(), *bench.values()])
    assert _flat([speeds[1]]) == pytest.approx([0.8, 0.8])
    steadied_cal, steadied_bench = _figures(steady_rounds(calibration, speeds)), _figures(steady_rounds(bench, speeds))
    assert _flat(steadied_cal["x"]) == pytest.approx(_flat([(50.0, 500.0)] * 3))
    assert _flat(steadied_bench["a"]) == pytest.approx(_flat([(10.0, 100.0)] * 3))
    # b ran steady in a slow round: 20 / 0.8 = 25, as fast against the calibration as it was measured
    assert steadied_bench["b"][1] == pytest.approx((25.0, 250.0))
    assert steadied_cal["kept median"] == [(7.0, 70.0)]


def test_a_round_keeps_its_ranks():
    # one factor a round: whatever the rounds, each round's placements order as they were measured
    measured = _rounds({"a": [1.0, 0.4, 1.3], "b": [0.9, 0.8, 1.0], "c": [1.2, 0.7, 0.6]})
    steadied = steady_rounds(measured, round_speeds(measured.values()))
    def order(timings: dict[str, list[Timing]], k: int) -> list[str]:
        return sorted(timings, key=lambda name: timings[name][k].tg_tokens_s)
    assert all(order(steadied, k) == order(measured, k) for k in range(3))


def test_decode_and_prefill_have_their_own_speed():
    # round 2: decode 20 % slow, prefill 10 % fast, on every placement
    measured = {name: [_timing(tg, pp), _timing(tg * 0.8, pp * 1.1), _timing(tg, pp)]
                for name, (tg, pp) in STEADY_FIGURES.items()}
    assert _flat([round_speeds(measured.values())[1]]) == pytest.approx([0.8, 1.1])


def test_a_round_slowed_by_the_hypervisor_is_not_divided_twice():
    # round 2 every process had 20 % of its CPU time stolen and ran 20 % slow: unstolen, every round reads the
    # steady figures, so every round's speed is 1; steady's figure is then unstolen's, the steady one
    measured = {name: [_timing(tg, pp, 0.0), _timing(tg * 0.8, pp * 0.8, 0.2), _timing(tg, pp, 0.0)]
                for name, (tg, pp) in STEADY_FIGURES.items()}
    speeds = round_speeds(measured.values())
    assert _flat(speeds) == pytest.approx(_flat([RoundSpeed(1.0, 1.0)] * 3))
    steadied = steady_rounds(measured, speeds)
    assert steadied["a"][1].stolen == 0.2    # kept, for the unstolen estimate after
    figure = ESTIMATES[ROUND_ESTIMATE[STEADY]](steadied["a"])
    assert (figure.tg_tokens_s, figure.pp_tokens_s) == pytest.approx((10.0, 100.0))


def test_noise_ranks_the_steady_halves():
    # the rows of the steady estimate hold steadied rounds; their halves are taken by unstolen's median
    steadied = steady_rounds(_rounds({name: [1.0, 0.8, 1.0, 0.8] for name in STEADY_FIGURES}),
                             (RoundSpeed(1.0, 1.0), RoundSpeed(0.8, 0.8)) * 2)
    rows = [Row(Placement(name, GEMMA, ("-ngl", "0")), 0, 0.0, 0.0, 0.0, 0.0, "", tuple(ts))
            for name, ts in steadied.items()]
    lines = noise(rows, STEADY)
    # every round steady again: the processes' medians lie 0 % apart, the halves rank a < b < c alike
    assert "the processes' medians by 0.0%" in lines[0]
    assert lines[-1] == ("odd rounds against even rounds (steady medians of each half): decode Spearman 1.000, "
                         "prefill 1.000")
