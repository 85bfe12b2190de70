"""bench_throughput.noise: the measurement's own spread and the odd rounds against the even, worked by hand."""
from __future__ import annotations

import math

from bench.bench_throughput import GEMMA, Placement, Row, noise
from planner.measuring.llama_bench import Timing


def _row(name: str, rounds: list[tuple[float, tuple[float, ...]]]) -> Row:
    """A placement whose decode and prefill alike read `rounds`: each round's median and its samples."""
    timings = tuple(Timing(fig, fig, 128, samples, samples) for fig, samples in rounds)
    return Row(Placement(name, GEMMA, ("-ngl", "0")), 0, 0.0, 0.0, 0.0, 0.0, "", timings)


def test_noise_by_hand():
    up = math.exp(0.1)
    rows = []
    for i, base in enumerate((10.0, 20.0, 30.0, 40.0)):
        # odd rounds (1st, 3rd) at `base`, even rounds at base·e^0.1; every round's two samples e^0.2 apart
        rounds = [(base * f, (base * f, base * f * math.exp(0.2))) for f in (1.0, up, 1.0, up)]
        rows.append(_row(f"p{i}", rounds))
    lines = noise(rows)
    # within a process: sd of (0, 0.2) = 0.2 / sqrt(2) = 14.1 %; between: sd of (0, .1, 0, .1) = sqrt(4 · .05² / 3)
    assert lines[0] == ("noise, decode: samples of one process apart by 14.1%, the processes' medians by 5.8% "
                        "(sd, median over placements)")
    assert lines[1].startswith("noise, prefill: samples of one process apart by 14.1%, the processes' medians by 5.8%")
    assert lines[2] == "odd rounds against even rounds (medians of each half): decode Spearman 1.000, prefill 1.000"


def test_halves_that_disagree_rank_against_each_other():
    # the odd rounds order the placements 10 < 20 < 30, the even rounds the other way round
    rows = [_row(f"p{i}", [(a, (a,)), (b, (b,))]) for i, (a, b) in enumerate(((10, 30), (20, 20.5), (30, 10)))]
    lines = noise(rows)
    # one sample a process: no spread within; the last line ranks the halves
    assert not any(line.startswith("noise, decode: samples") for line in lines)
    assert lines[-1] == "odd rounds against even rounds (medians of each half): decode Spearman -1.000, prefill -1.000"


def test_the_stolen_share_is_set_against_each_process_slowness():
    # one placement of three rounds, 10 / 8 / 10 tok/s (median 10): log deviations (0, ln 0.8, 0); stolen
    # shares (0.01, 0.21, 0.01) -> Pearson -1 (two points alike, one apart, opposite ways)
    timings = tuple(Timing(fig, fig, 128, (fig,), (fig,), stolen=share) for fig, share in
                    ((10.0, 0.01), (8.0, 0.21), (10.0, 0.01)))
    rows = [Row(Placement("p", GEMMA, ("-ngl", "0")), 0, 0.0, 0.0, 0.0, 0.0, "", timings)]
    lines = noise(rows, "unstolen")
    assert "stolen by the hypervisor: 1.0% of the CPU time in the median process (1.0%–21.0%, 3 processes)" in lines
    assert ("a process's stolen share against its log deviation from its placement's median: Pearson decode "
            "-1.000, prefill -1.000") in lines
    # odd rounds (10 at 1 %, 10 at 1 %) against the even (8 at 21 % -> 8 / 0.79): one placement, no rank
    assert lines[-1].startswith("odd rounds against even rounds (unstolen medians of each half)")
