"""The calibration fit (planner/measuring/calibrate.py): rates and the per-split hand-off latency from
timings written by hand from known rates. No timing is measured here."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.hardware.inventory import (
    Backend,
    CalibratedFigure,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    Quantity,
)
from planner.measuring.calibrate import (
    FFN_ON_HOST,
    OUTPUT_ON_HOST,
    CalibrationRun,
    _device_latency_figures,
    attention_costs,
    calibration_placements,
    pooled,
)
from planner.measuring.llama_bench import (
    ESTIMATES,
    Timing,
    cpu_jiffies,
    fastest_timing,
    median_timing,
    stolen_share,
    unstolen_timing,
)
from planner.speed.calibration_fit import (
    ATTENTION,
    ATTENTION_SWEPT,
    AttentionCost,
    CalibrationError,
    Observation,
    RateFit,
    fit_linear,
    fit_rates,
    per_device,
    same_hardware,
    without_attention,
)

GIB = 1 << 30


def test_fit_linear_recovers_a_line():
    # t = 2 s per unit + 0.5 s per boundary, exactly
    rows = [[1.0, 0.0], [1.0, 1.0], [2.0, 3.0], [3.0, 1.0]]
    fit = fit_linear(rows, [2.0, 2.5, 5.5, 6.5])
    assert fit.coefficients == pytest.approx((2.0, 0.5))
    assert fit.residual_rms_s == pytest.approx(0.0, abs=1e-12)


def test_fit_linear_without_spare_placements_has_no_error_estimate():
    fit = fit_linear([[4.0]], [2.0])
    assert fit.coefficients == pytest.approx((0.5,))
    assert math.isnan(fit.stderr[0])


def _decode(host_gbs: float, rpc_gbs: float, latency_s: float, host_bytes: float, rpc_bytes: float,
            n_boundaries: int) -> Observation:
    """A tg time as the throughput model writes it: bytes / bandwidth per device, plus the boundaries."""
    seconds = host_bytes / (host_gbs * 1e9) + rpc_bytes / (rpc_gbs * 1e9) + n_boundaries * latency_s
    work = {k: v for k, v in (("CPU", host_bytes), ("RPC0", rpc_bytes)) if v}
    return Observation(seconds, work, n_boundaries)


def test_the_slope_against_boundaries_is_the_hand_off_latency():
    # host 10 GB/s, RPC0 5 GB/s, 300 µs per boundary; 250 MB per token split four ways
    obs = [_decode(10, 5, 300e-6, 250e6, 0, 0),          # the host alone
           _decode(10, 5, 300e-6, 0, 250e6, 1),          # RPC0 with the output
           _decode(10, 5, 300e-6, 180e6, 70e6, 2),       # RPC0 with the layers, output on the host
           _decode(10, 5, 300e-6, 40e6, 210e6, 1)]       # half the layers on RPC0
    fit = fit_rates(obs)
    assert 1 / fit.seconds_per_unit["CPU"] == pytest.approx(10e9)
    assert 1 / fit.seconds_per_unit["RPC0"] == pytest.approx(5e9)
    assert fit.per_boundary_s == pytest.approx(300e-6)


def test_noise_is_seen_in_the_latency_error():
    obs = [_decode(10, 5, 300e-6, 250e6, 0, 0), _decode(10, 5, 300e-6, 0, 250e6, 1),
           _decode(10, 5, 300e-6, 180e6, 70e6, 2), _decode(10, 5, 300e-6, 40e6, 210e6, 1)]
    noisy = [Observation(o.seconds * f, o.work, o.n_boundaries) for o, f in zip(obs, (1.0, 1.01, 0.99, 1.0),
                                                                                strict=True)]
    fit = fit_rates(noisy)
    assert fit.per_boundary_stderr_s > 0
    assert fit.per_boundary_s == pytest.approx(300e-6, abs=5 * fit.per_boundary_stderr_s)


def test_a_known_boundary_cost_is_subtracted_not_fitted():
    # prefill: FLOPs / FLOPS plus 1 ms per boundary already known
    obs = [Observation(2.0 + 0.001 * n, {"CPU": 1e12}, n) for n in (0, 1, 2)]
    fit = fit_rates(obs, per_boundary_s=0.001)
    assert 1 / fit.seconds_per_unit["CPU"] == pytest.approx(0.5e12)
    assert fit.per_boundary_s == 0.001


def test_a_rate_at_or_below_zero_is_refused():
    with pytest.raises(CalibrationError, match="no positive rate"):
        fit_rates([Observation(1.0, {"CPU": 1e8, "RPC0": 1e8}, 0), Observation(0.1, {"CPU": 2e8, "RPC0": 1e8}, 0)])


def test_placements_vary_the_boundaries_on_each_endpoint():
    placements = {p.name: (list(p.flags), p.depth) for p in calibration_placements(18, ["RPC0", "RPC1"], 2048)}
    assert placements["host"] == (["-ngl", "0"], 0)
    assert placements["host, depth 2048"] == (["-ngl", "0"], 2048)
    assert placements["RPC0 all"] == (["-dev", "RPC0", "-ngl", "999"], 0)
    assert placements["RPC1 layers, output on host"] == (["-dev", "RPC1", "-ngl", "999", "-ot", OUTPUT_ON_HOST], 0)
    assert placements["RPC0 half"] == (["-dev", "RPC0", "-ngl", "9"], 0)
    assert placements["RPC1 all, FFN on host"] == (["-dev", "RPC1", "-ngl", "999", "-ot", FFN_ON_HOST], 0)
    assert placements["RPC0 all, depth 2048"] == (["-dev", "RPC0", "-ngl", "999"], 2048)
    assert placements["split evenly"] == (["-dev", "RPC0,RPC1", "-ngl", "999", "-ts", "1,1"], 0)
    # one boundary between two devices: the 18 layers on RPC0, llama.cpp's output layer (layer 18) on RPC1
    assert placements["RPC0 layers, output on RPC1"] == (["-dev", "RPC0,RPC1", "-ngl", "999", "-ts", "18,1"], 0)
    assert "RPC1 layers, output on RPC0" not in placements   # two endpoints: one pair
    three = {p.name for p in calibration_placements(18, ["RPC0", "RPC1", "RPC2"])}
    assert {"RPC0 layers, output on RPC1", "RPC1 layers, output on RPC2", "RPC2 layers, output on RPC0"} <= three
    one = {p.name for p in calibration_placements(18, ["RPC0"])}
    assert "split evenly" not in one and not any("output on RPC" in name for name in one)


def test_a_boundary_between_two_devices_is_fitted_apart():
    """Host 10 GB/s, RPC0 and RPC1 5 GB/s, 300 µs per boundary, 3 ms more where both sides are devices:
    t = bytes / bandwidth + n · 300 µs + n_dev · 3 ms, worked out here for each placement."""
    def obs(host: float, rpc0: float, rpc1: float, n: int, n_dev: int) -> Observation:
        seconds = host / 10e9 + (rpc0 + rpc1) / 5e9 + n * 300e-6 + n_dev * 3e-3
        work = {k: v for k, v in (("CPU", host), ("RPC0", rpc0), ("RPC1", rpc1)) if v}
        return Observation(seconds, work, n, n_dev)
    fit = fit_rates([obs(250e6, 0, 0, 0, 0), obs(0, 250e6, 0, 1, 0), obs(180e6, 70e6, 0, 2, 0),
                     obs(0, 0, 250e6, 1, 0), obs(0, 80e6, 170e6, 2, 1), obs(0, 125e6, 125e6, 2, 1)])
    assert fit.per_boundary_s == pytest.approx(300e-6)
    assert fit.device_extra_s == pytest.approx(3e-3)
    assert 1 / fit.seconds_per_unit["RPC1"] == pytest.approx(5e9)


def test_an_attention_column_at_or_below_zero_is_dropped_not_refused():
    # KV bytes that cost nothing measurable: the fit keeps the bandwidth and drops the attention rate
    obs = [Observation(1.0 + 0.1 * k, {"CPU": 5e9, "CPU" + ATTENTION: 1e6 * k}, 0) for k in (0, 0, 0)]
    obs += [Observation(1.0 - 1e-3, {"CPU": 5e9, "CPU" + ATTENTION: 1e8}, 0)]
    fit = fit_rates(obs)
    assert set(fit.seconds_per_unit) == {"CPU"}
    assert 1 / fit.seconds_per_unit["CPU"] == pytest.approx(5e9, rel=1e-3)


def test_attention_is_fitted_apart_from_the_weights():
    # host: weights at 5 GB/s, the KV cache at 1 GB/s; runs at depth 0 (8 cells) and at depth (2048)
    def run(weights: float, kv: float) -> Observation:
        return Observation(weights / 5e9 + kv / 1e9, {"CPU": weights, "CPU" + ATTENTION: kv}, 0)
    fit = fit_rates([run(2.4e8, 5e4), run(2.4e8, 1.4e7), run(1.2e8, 5e4), run(1.2e8, 1.4e7)])
    assert 1 / fit.seconds_per_unit["CPU"] == pytest.approx(5e9)
    assert 1 / fit.seconds_per_unit["CPU" + ATTENTION] == pytest.approx(1e9)


def _run(name: str, flags: tuple[str, ...], depth: int, seconds: float, work: dict[str, float],
         probe: bool = False) -> CalibrationRun:
    timing = Timing(1 / seconds, 100.0, 128)
    return CalibrationRun(name, flags, timing, Observation(seconds, work, 1), Observation(1.0, {}, 1), {}, depth,
                          probe)


def _attention_pair(dev: str, flags: tuple[str, ...], row_bytes: int, per_byte_s: float,
                    probe: bool) -> list[CalibrationRun]:
    """A placement at depth 0 (600 pairs) and 2048 (40,600 pairs) whose layers' cache rows are `row_bytes` a
    cell: 20 ms a token at depth 0 plus the bytes its query heads sweep at `per_byte_s`."""
    def run(depth: int, pairs: int) -> CalibrationRun:
        swept = pairs * row_bytes
        return _run(f"{dev} {row_bytes}, depth {depth}", flags, depth, 0.020 + swept * per_byte_s,
                    {dev: 2.5e8, dev + ATTENTION_SWEPT: swept})
    return [run(0, 600), run(2048, 40_600)]


def test_the_swept_bytes_price_attention_whatever_the_shape():
    """0.1 ns a swept byte (10 GB/s): 40,000 pairs of 1 KiB rows add 4.096 ms, of 512 B rows 2.048 ms. The
    calibration model's pair of runs and the probe's (same flags, told apart by `probe`) are observations of
    the same rate; the known attention then comes off each observation, its columns gone."""
    host = ("-ngl", "0")
    runs = (_attention_pair("CPU", host, 1024, 0.1e-9, probe=False)
            + _attention_pair("CPU", host, 512, 0.1e-9, probe=True))
    costs = attention_costs(runs)
    assert costs == {"CPU": AttentionCost(pytest.approx(0.1e-9))}
    for run in runs:
        left = without_attention(run.decode, costs)
        assert left.seconds == pytest.approx(0.020) and left.work == {"CPU": 2.5e8}


def test_two_shapes_that_disagree_meet_in_a_least_squares_through_the_origin():
    """Rows of 1 KiB at 0.1 ns a byte add 4.096 ms for 40.96 MB; rows of 512 B at 0.2 ns add 4.096 ms for
    20.48 MB. Through the origin: sum(s·n) / sum(n²) = 4.096e-3 · 61.44e6 / (40.96e6² + 20.48e6²) = 0.12 ns."""
    host = ("-ngl", "0")
    runs = (_attention_pair("CPU", host, 1024, 0.1e-9, probe=False)
            + _attention_pair("CPU", host, 512, 0.2e-9, probe=True))
    assert attention_costs(runs) == {"CPU": AttentionCost(pytest.approx(0.12e-9))}


def test_probe_placements_follow_each_depth_run():
    names = [p.name for p in calibration_placements(18, ["RPC0"], 2048, probe=True)]
    assert names[:4] == ["host", "host, depth 2048", "probe: host", "probe: host, depth 2048"]
    assert names[-2:] == ["probe: RPC0 all", "probe: RPC0 all, depth 2048"]
    probes = [p for p in calibration_placements(18, ["RPC0"], 2048, probe=True) if p.probe]
    assert [(p.flags, p.depth) for p in probes] == [(("-ngl", "0"), 0), (("-ngl", "0"), 2048),
                                                    (("-dev", "RPC0", "-ngl", "999"), 0),
                                                    (("-dev", "RPC0", "-ngl", "999"), 2048)]
    assert not any(p.probe for p in calibration_placements(18, ["RPC0"], 2048))


def test_attention_is_what_the_depth_adds_to_the_same_placement():
    """RPC0 alone at depth 0 (600 KB swept) and 2048 (40.6 MB): 20 ms against 22 ms a token, so 2 ms for
    40 MB, 0.05 ns a byte. The host's pair of runs took no longer at depth: no figure for it. The weights'
    time cancels whatever the bandwidth; a placement without its depth-0 twin is not used."""
    rpc0 = ("-dev", "RPC0", "-ngl", "999")
    runs = [_run("RPC0 all", rpc0, 0, 0.020, {"RPC0": 2.5e8, "RPC0" + ATTENTION_SWEPT: 6e5}),
            _run("RPC0 all, depth 2048", rpc0, 2048, 0.022, {"RPC0": 2.5e8, "RPC0" + ATTENTION_SWEPT: 4.06e7}),
            _run("host", ("-ngl", "0"), 0, 0.018, {"CPU": 2.5e8, "CPU" + ATTENTION_SWEPT: 6e5}),
            _run("host, depth 2048", ("-ngl", "0"), 2048, 0.0179, {"CPU": 2.5e8, "CPU" + ATTENTION_SWEPT: 4.06e7}),
            _run("RPC1 all, depth 2048", ("-dev", "RPC1"), 2048, 0.03,
                 {"RPC1": 2.5e8, "RPC1" + ATTENTION_SWEPT: 4.06e7})]
    per_byte = attention_costs(runs)
    assert per_byte == {"RPC0": AttentionCost(pytest.approx(0.05e-9))}
    # the known attention comes off the observation and its column goes: 22 ms - 40.6 MB · 0.05 ns = 19.97 ms
    left = without_attention(runs[1].decode, per_byte)
    assert left.seconds == pytest.approx(0.022 - 4.06e7 * 0.05e-9)
    assert left.work == {"RPC0": 2.5e8}
    # a device without a figure: its column goes, its time stays (its attention is the bandwidth's then)
    host = without_attention(runs[3].decode, per_byte)
    assert host.seconds == 0.0179 and host.work == {"CPU": 2.5e8}


def _rpc(name: str, endpoint: str, total: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, total, total, 0, 0, 0, endpoint=endpoint)


def test_rpc_servers_at_one_address_with_the_same_memory_are_one_piece_of_hardware():
    inventory = Inventory((_rpc("RPC0", "127.0.0.1:5000", 24 * GIB), _rpc("RPC1", "127.0.0.1:5001", 24 * GIB),
                           _rpc("RPC2", "127.0.0.1:5002", 8 * GIB),          # another device of that machine
                           _rpc("RPC3", "10.0.0.2:5000", 24 * GIB),          # another machine
                           _rpc("RPC4", "127.0.0.1:5003", 24 * GIB)),
                          HostSpec(32 * GIB, 30 * GIB, 0, ""))
    assert same_hardware(inventory) == {"RPC0+RPC1+RPC4": ("RPC0", "RPC1", "RPC4")}
    assert same_hardware(Inventory(inventory.devices[2:4], inventory.host)) == {}


def test_a_group_is_fitted_as_one_column_and_written_for_each_device():
    """RPC0 and RPC1 are the same hardware at 5 GB/s; one run of each drifted +10 % and -10 %. Fitted apart they
    come out 4.5 and 5.5 GB/s; pooled, both get the one rate the two runs give together."""
    groups = {"RPC0+RPC1": ("RPC0", "RPC1")}
    def run(dev: str, drift: float) -> CalibrationRun:
        work = {dev: 2.5e8, dev + ATTENTION_SWEPT: 600.0}
        return CalibrationRun(f"{dev} all", ("-dev", dev), Timing(20.0, 100.0, 128),
                              Observation(0.05 * drift, work, 1), Observation(1.0, {dev: 1e10}, 1), {dev: 2.5e8})
    runs = [run("RPC0", 1.1), run("RPC1", 0.9)]
    apart = fit_rates([without_attention(r.decode, {}) for r in runs], per_boundary_s=0.0)
    assert 1 / apart.seconds_per_unit["RPC0"] == pytest.approx(2.5e8 / 0.055)
    together = [pooled(r, groups) for r in runs]
    assert together[0].decode.work == {"RPC0+RPC1": 2.5e8, "RPC0+RPC1" + ATTENTION_SWEPT: 600.0}
    assert together[1].prefill.work == {"RPC0+RPC1": 1e10} and together[1].streamed == {"RPC0+RPC1": 2.5e8}
    fit = fit_rates([without_attention(r.decode, {}) for r in together], per_boundary_s=0.0)
    assert 1 / fit.seconds_per_unit["RPC0+RPC1"] == pytest.approx(5e9)
    figures = per_device([CalibratedFigure("RPC0+RPC1", Quantity.BANDWIDTH, 5e9, "tg"),
                          CalibratedFigure("CPU", Quantity.BANDWIDTH, 9e9, "tg")], groups)
    assert [(f.device, f.value) for f in figures] == [("RPC0", 5e9), ("RPC1", 5e9), ("CPU", 9e9)]
    assert "one figure for RPC0, RPC1" in figures[0].how and figures[2].how == "tg"
    assert pooled(runs[0], {}) is runs[0]


def test_attention_of_a_group_adds_up():
    """Two depth pairs on one group's column: +2 ms and +4 ms over 40 MB each, 0.075 ns a byte together."""
    runs = []
    for dev, extra in (("RPC0", 0.002), ("RPC1", 0.004)):
        flags = ("-dev", dev, "-ngl", "999")
        runs += [_run(f"{dev} all", flags, 0, 0.020, {"G": 2.5e8, "G" + ATTENTION_SWEPT: 6e5}),
                 _run(f"{dev} all, depth 2048", flags, 2048, 0.020 + extra,
                      {"G": 2.5e8, "G" + ATTENTION_SWEPT: 4.06e7})]
    assert attention_costs(runs) == {"G": AttentionCost(pytest.approx(0.075e-9))}


def test_a_device_to_device_extra_above_zero_is_written_even_within_noise():
    """+400 ± 500 µs beyond a 250 µs split latency: not told apart from noise, still the best estimate, so
    RPC0 and RPC1 get 650 µs and the method says how sure it is; an extra at or below zero writes nothing."""
    def fit(extra: float, err: float) -> RateFit:
        return RateFit({}, 250e-6, 20e-6, 0.0, extra, err)
    figures = _device_latency_figures(["RPC0", "RPC1"], fit(400e-6, 500e-6), "over 21 placements")
    assert [(f.device, f.quantity) for f in figures] == [("RPC0", Quantity.DEVICE_LATENCY),
                                                          ("RPC1", Quantity.DEVICE_LATENCY)]
    assert figures[0].value == pytest.approx(650e-6)
    assert "+400 ± 500 µs" in figures[0].how and "within 2 standard errors of none" in figures[0].how
    told = _device_latency_figures(["RPC0"], fit(2e-3, 500e-6), "x")
    assert told[0].value == pytest.approx(2.25e-3) and "within" not in told[0].how
    assert _device_latency_figures(["RPC0"], fit(-100e-6, 500e-6), "x") == []
    assert _device_latency_figures(["RPC0"], RateFit({}, 250e-6, 20e-6, 0.0), "x") == []


def test_the_fastest_estimate_takes_the_fastest_sample_of_every_round():
    rounds = [Timing(40.0, 200.0, 128, (38.0, 40.0, 52.0), (190.0, 200.0, 205.0)),
              Timing(45.0, 210.0, 128, (30.0, 45.0, 47.0), (209.0, 210.0, 230.0))]
    fastest = fastest_timing(rounds)
    assert (fastest.tg_tokens_s, fastest.pp_tokens_s, fastest.n_ubatch) == (52.0, 230.0, 128)
    assert fastest.tg_samples == (38.0, 40.0, 52.0, 30.0, 45.0, 47.0)
    median = median_timing(rounds)
    assert (median.tg_tokens_s, median.pp_tokens_s) == (42.5, 205.0)


def test_timings_kept_without_samples_count_with_their_medians():
    rounds = [Timing(40.0, 200.0, 64), Timing(45.0, 190.0, 64, (44.0, 45.0, 46.0), (180.0, 190.0, 195.0))]
    fastest = fastest_timing(rounds)
    assert (fastest.tg_tokens_s, fastest.pp_tokens_s) == (46.0, 200.0)


def test_the_unstolen_estimate_divides_each_round_by_the_cpu_time_it_had():
    # round 1 lost a fifth of the CPU time: 40 / 0.8 = 50 and 200 / 0.8 = 250; round 2 lost none; round 3 has
    # no figure and counts as measured. Medians: (50, 45, 30) -> 45, (250, 210, 220) -> 220.
    rounds = [Timing(40.0, 200.0, 128, (40.0,), (200.0,), stolen=0.2), Timing(45.0, 210.0, 128, stolen=0.0),
              Timing(30.0, 220.0, 128)]
    unstolen = unstolen_timing(rounds)
    assert (unstolen.tg_tokens_s, unstolen.pp_tokens_s, unstolen.n_ubatch) == (45.0, 220.0, 128)
    assert unstolen.stolen is None and unstolen.tg_samples == (40.0,)
    assert ESTIMATES["unstolen"] is unstolen_timing


def test_the_stolen_share_is_read_off_proc_stat_between_two_readings():
    # (steal, all) ticks: 30 of the 1000 ticks between the readings were stolen
    assert stolen_share((10, 5000), (40, 6000)) == 0.03
    assert stolen_share(None, (40, 6000)) is None and stolen_share((10, 5000), (10, 5000)) is None
    now = cpu_jiffies()
    if Path("/proc/stat").exists():
        assert now is not None and 0 <= now[0] <= now[1]
