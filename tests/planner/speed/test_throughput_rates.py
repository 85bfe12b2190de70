"""Which rates the throughput model uses (calibrated over stated over assumed) and the split-boundary
terms, checked against figures worked out here by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.units import GiB
from planner.hardware.inventory import (
    Backend,
    CalibratedFigure,
    Calibration,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    Quantity,
)
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.measuring.calibrate import FFN_ON_HOST
from planner.memory.estimate import estimate
from planner.model.costs import WeightGroup, cost_table
from planner.registry.examples import resolve_model
from planner.speed.throughput import (
    ASSUMED,
    CALIBRATED,
    STATED,
    PlacementView,
    Rates,
    decode_bytes,
    predict,
    prefill_work,
    view_of_estimate,
)

LATENCY_S, LINK = 300e-6, 1e9


def _rpc(i: int, bandwidth: int = 0) -> DeviceSpec:
    return DeviceSpec(f"RPC{i}", DeviceKind.RPC, Backend.RPC, 8 * GiB, 8 * GiB, bandwidth, 0, 0,
                      endpoint=f"127.0.0.1:{50052 + i}")


def _calibration(*devices: str) -> Calibration:
    figures = [CalibratedFigure("CPU", Quantity.BANDWIDTH, 8e9, "by hand"),
               CalibratedFigure("CPU", Quantity.FLOPS, 2e11, "by hand")]
    for dev in devices:
        figures += [CalibratedFigure(dev, Quantity.BANDWIDTH, 4e9, "by hand"),
                    CalibratedFigure(dev, Quantity.FLOPS, 1e11, "by hand"),
                    CalibratedFigure(dev, Quantity.SPLIT_LATENCY, LATENCY_S, "by hand"),
                    CalibratedFigure(dev, Quantity.LINK, LINK, "by hand")]
    return Calibration("2026-12-01T00:00:00+00:00", "by hand", "none", tuple(figures))


def test_calibrated_figures_win_over_stated_ones_and_stated_over_assumed():
    inv = Inventory((_rpc(0, bandwidth=int(100e9)), _rpc(1, bandwidth=int(50e9)), _rpc(2)),
                    HostSpec(16 * GiB, 16 * GiB, int(20e9), "host"), calibration=_calibration("RPC0"))
    rates = Rates(inv)
    assert rates.bandwidth("RPC0") == 4e9 and rates.sources == {CALIBRATED}
    assert rates.bandwidth("RPC1") == 50e9 and rates.sources == {CALIBRATED, STATED}
    assert rates.bandwidth("CPU") == 8e9
    assert rates.latency("RPC0") == LATENCY_S
    rates.bandwidth("RPC2")   # nothing stated, nothing measured: the fallback
    assert rates.source_list == (CALIBRATED, STATED, ASSUMED) and rates.assumed


@pytest.fixture(scope="module")
def gemma():
    ctx = model_context(resolve_model("example:gemma3-270m"))
    return ctx, cost_table(ctx.model, ctx.facts)


def test_one_more_split_boundary_costs_the_hand_off_and_the_boundary_copy(gemma):
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((_rpc(0), _rpc(1)), HostSpec(16 * GiB, 16 * GiB, 0, "host"),
                    calibration=_calibration("RPC0", "RPC1"))
    one = PlacementView(tuple(["RPC0"] * n), "RPC0", frozenset(), 1024, n_ubatch=128, n_past=0)
    two = PlacementView(tuple(["RPC0"] * (n // 2) + ["RPC1"] * (n - n // 2)), "RPC1", frozenset(), 1024,
                        n_ubatch=128, n_past=0)
    p1, p2 = predict(ctx.facts, costs, one, inv), predict(ctx.facts, costs, two, inv)
    assert (p1.n_boundaries, p2.n_boundaries) == (1, 2)
    assert p1.calibrated and p1.rate_sources == (CALIBRATED,)
    act = ctx.facts.n_embd * 4   # the f32 activation of one token
    # same bytes and FLOPs at the same rates: the difference is one boundary
    assert 1 / p2.decode_tokens_s - 1 / p1.decode_tokens_s == pytest.approx(LATENCY_S + act / LINK)
    assert 128 / p2.prefill_tokens_s - 128 / p1.prefill_tokens_s == pytest.approx(LATENCY_S + 128 * act / LINK)


def test_pipeline_parallelism_overlaps_the_ubatches_of_a_prompt(gemma):
    """Two devices under llama.cpp's pipeline parallelism, a prompt of four 128-token ubatches in one
    llama_decode: the first ubatch passes every stage, each further one costs the busiest device's time.
    Each device's time per ubatch is worked out here from its FLOPs, weight bytes and the boundaries it
    sends (the host sends the embeddings to RPC0, RPC0 the activations to RPC1)."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((_rpc(0), _rpc(1)), HostSpec(16 * GiB, 16 * GiB, 0, "host"),
                    calibration=_calibration("RPC0", "RPC1"))
    split = PlacementView(tuple(["RPC0"] * (n // 2) + ["RPC1"] * (n - n // 2)), "RPC1", frozenset(), 1024,
                          n_ubatch=128, n_past=0)
    work = prefill_work(ctx.facts, costs, split, None)
    flops, bandwidth = {"CPU": 2e11, "RPC0": 1e11, "RPC1": 1e11}, {"CPU": 8e9, "RPC0": 4e9, "RPC1": 4e9}
    busy = {d: work.flops.get(d, 0) / flops[d] + work.attention.get(d, 0) / flops[d]
            + work.streamed.get(d, 0) / bandwidth[d] for d in flops}
    crossing = LATENCY_S + 128 * ctx.facts.n_embd * 4 / LINK
    busy["CPU"] += crossing
    busy["RPC0"] += crossing
    t_ubatch = sum(busy.values())
    one_at_a_time = predict(ctx.facts, costs, split, inv).prefill_tokens_s
    assert one_at_a_time == pytest.approx(128 / t_ubatch)
    piped = replace(split, pipeline=True, n_batch=512)
    assert piped.n_ubatches == 4
    assert predict(ctx.facts, costs, piped, inv).prefill_tokens_s == pytest.approx(
        512 / (t_ubatch + 3 * max(busy.values())))
    # a prompt of one ubatch, or no pipeline parallelism: nothing overlaps
    assert predict(ctx.facts, costs, replace(piped, n_batch=128), inv).prefill_tokens_s == pytest.approx(one_at_a_time)
    assert predict(ctx.facts, costs, replace(piped, pipeline=False), inv).prefill_tokens_s == pytest.approx(
        one_at_a_time)
    # decode is one token: never pipelined
    decode = [predict(ctx.facts, costs, v, inv).decode_tokens_s for v in (piped, split)]
    assert decode[0] == decode[1]


def test_an_estimate_of_a_full_split_is_seen_with_pipeline_parallelism(gemma):
    """llama.cpp turns pipeline parallelism on for several devices with every layer offloaded (llama_context);
    the view carries it and the prompt tokens one llama_decode takes (min(-b, -c))."""
    ctx, _ = gemma
    inv = Inventory((_rpc(0), _rpc(1)), HostSpec(16 * GiB, 16 * GiB, 0, "host"))
    rpc = ["--rpc", "127.0.0.1:50052,127.0.0.1:50053"]
    split = view_of_estimate(ctx, estimate(ctx, parse_llama_flags([*rpc, "-ngl", "999", "-c", "4096", "-ub", "256"]),
                                           inv))
    assert split.pipeline and split.n_batch == 2048 and split.n_ubatches == 8
    partial = view_of_estimate(ctx, estimate(ctx, parse_llama_flags([*rpc, "-ngl", "10", "-c", "1024"]), inv))
    assert not partial.pipeline and partial.n_batch == 1024 and partial.n_ubatches == 2


def test_a_boundary_between_two_devices_costs_the_device_latency(gemma):
    """The one-boundary split of the test above, with a calibrated device-to-device latency of 3 ms: the
    boundary between RPC0 and RPC1 costs that instead of the split latency; the host's boundary does not."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    cal = _calibration("RPC0", "RPC1")
    cal = replace(cal, figures=cal.figures + tuple(CalibratedFigure(d, Quantity.DEVICE_LATENCY, 3e-3, "by hand")
                                                   for d in ("RPC0", "RPC1")))
    plain = Inventory((_rpc(0), _rpc(1)), HostSpec(16 * GiB, 16 * GiB, 0, "host"),
                      calibration=_calibration("RPC0", "RPC1"))
    with_dev = replace(plain, calibration=cal)
    one = PlacementView(tuple(["RPC0"] * n), "RPC0", frozenset(), 1024, n_ubatch=128, n_past=0)
    two = PlacementView(tuple(["RPC0"] * (n // 2) + ["RPC1"] * (n - n // 2)), "RPC1", frozenset(), 1024,
                        n_ubatch=128, n_past=0)
    # one device: its only boundary is with the host, so the device figure changes nothing
    alone = [predict(ctx.facts, costs, one, inv).decode_tokens_s for inv in (with_dev, plain)]
    assert alone[0] == alone[1]
    d_plain = 1 / predict(ctx.facts, costs, two, plain).decode_tokens_s
    d_dev = 1 / predict(ctx.facts, costs, two, with_dev).decode_tokens_s
    assert d_dev - d_plain == pytest.approx(3e-3 - LATENCY_S)
    assert Rates(with_dev).device_latency("RPC0", "RPC1") == 3e-3
    assert Rates(plain).device_latency("RPC0", "RPC1") == LATENCY_S


def test_decode_at_a_depth_reads_the_cells_written_so_far(gemma):
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((), HostSpec(16 * GiB, 16 * GiB, 0, "host"), calibration=_calibration())
    shallow = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=100)
    deep = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=2100)
    extra = 0
    for layer in costs.layers:   # sliding-window layers read at most their window
        cells = (min(2100, layer.window) - min(100, layer.window)) if layer.window else 2000
        extra += layer.kv_bytes_per_cell * cells
    t_shallow = 1 / predict(ctx.facts, costs, shallow, inv).decode_tokens_s
    t_deep = 1 / predict(ctx.facts, costs, deep, inv).decode_tokens_s
    assert t_deep - t_shallow == pytest.approx(extra / 8e9)


def test_attention_reads_the_cache_at_its_calibrated_rate(gemma):
    """A CPU's flash attention reads f16 KV rows slower than it streams weights: with an attention rate
    calibrated, the depth's extra cells cost their bytes at that rate, the weights keep theirs."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    cal = _calibration()
    cal = Calibration(cal.date, cal.method, cal.tool,
                      (*cal.figures, CalibratedFigure("CPU", Quantity.ATTENTION_BANDWIDTH, 1e9, "by hand")))
    inv = Inventory((), HostSpec(16 * GiB, 16 * GiB, 0, "host"), calibration=cal)
    shallow = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=100)
    deep = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=2100)
    extra = sum(layer.kv_bytes_per_cell * ((min(2100, layer.window) - min(100, layer.window)) if layer.window
                                           else 2000) for layer in costs.layers)
    p_shallow, p_deep = predict(ctx.facts, costs, shallow, inv), predict(ctx.facts, costs, deep, inv)
    assert 1 / p_deep.decode_tokens_s - 1 / p_shallow.decode_tokens_s == pytest.approx(extra / 1e9)
    [stage] = p_deep.stages
    assert stage.kv_bytes_per_token - p_shallow.stages[0].kv_bytes_per_token == extra


def test_attention_calibrated_per_pair_costs_the_pairs_the_depth_adds(gemma):
    """Calibrated per (query head, cached cell) pair, a deeper cache costs its extra pairs at that rate:
    Gemma 3 270M has 4 query heads a layer; a sliding-window layer reads at most its window. Where the
    pairs would go faster than the device reads their bytes, the bytes at its bandwidth bound them."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    heads = {ctx.facts.layers[layer.index].n_head for layer in costs.layers}
    assert heads == {4}
    extra_pairs = sum(4 * ((min(2100, layer.window) - min(100, layer.window)) if layer.window else 2000)
                      for layer in costs.layers)
    extra_bytes = sum(layer.kv_bytes_per_cell * ((min(2100, layer.window) - min(100, layer.window))
                                                 if layer.window else 2000) for layer in costs.layers)
    shallow = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=100)
    deep = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=2100)

    def added(per_pair_rate: float) -> float:
        cal = _calibration()
        cal = replace(cal, figures=(*cal.figures,
                                    CalibratedFigure("CPU", Quantity.ATTENTION_CELLS, per_pair_rate, "by hand")))
        inv = Inventory((), HostSpec(16 * GiB, 16 * GiB, 0, "host"), calibration=cal)
        return 1 / predict(ctx.facts, costs, deep, inv).decode_tokens_s - 1 / predict(
            ctx.facts, costs, shallow, inv).decode_tokens_s

    assert added(25e6) == pytest.approx(extra_pairs / 25e6)        # 40 ns a pair: the pairs decide
    assert added(1e12) == pytest.approx(extra_bytes / 8e9)         # absurdly fast pairs: the bytes at 8 GB/s


def test_attention_calibrated_per_pair_and_per_value_prices_the_head_width(gemma):
    """Calibrated per pair and per K/V value (two head widths), a pair of Gemma 3's 256-wide heads costs its
    fixed part and 256 + 256 values: 2000 more cells of a global layer's 4 heads at 20 ns a pair and 0.1 ns a
    value are 4 · 2000 · (20 + 512 · 0.1) ns."""
    ctx, costs = gemma
    assert {(lf.head_dim_k, lf.head_dim_v) for lf in ctx.facts.layers} == {(256, 256)}
    extra_pairs = sum(4 * ((min(2100, layer.window) - min(100, layer.window)) if layer.window else 2000)
                      for layer in costs.layers)
    added = _depth_adds(ctx, costs, CalibratedFigure("CPU", Quantity.ATTENTION_CELLS, 50e6, "by hand"),
                        CalibratedFigure("CPU", Quantity.ATTENTION_VALUES, 10e9, "by hand"))
    assert added == pytest.approx(extra_pairs * (20e-9 + 512 * 0.1e-9))


def test_attention_calibrated_per_swept_byte_streams_the_row_once_per_query_head(gemma):
    """With a calibrated sweep rate, each of a layer's query heads streams the layer's whole K and V row of every
    cell it reads (the row holds all KV heads): Gemma 3 270M's 4 query heads over 2000 more cells of a global
    layer sweep 4 x its cache bytes, at 10 GB/s here — the sweep figure prices the attention, not the per-pair
    one of an older calibration beside it, nor the cache's bytes at the 8 GB/s bandwidth (a quarter of it)."""
    ctx, costs = gemma
    extra_bytes = sum(layer.kv_bytes_per_cell * ((min(2100, layer.window) - min(100, layer.window))
                                                 if layer.window else 2000) for layer in costs.layers)
    added = _depth_adds(ctx, costs, CalibratedFigure("CPU", Quantity.ATTENTION_SWEEP, 10e9, "by hand"),
                        CalibratedFigure("CPU", Quantity.ATTENTION_CELLS, 1e6, "an older calibration"))
    assert added == pytest.approx(4 * extra_bytes / 10e9)


def _depth_adds(ctx, costs, *figures: CalibratedFigure) -> float:
    """The seconds 2000 more cached tokens (100 -> 2100) add to a token on the host alone, calibrated with
    `figures` beside the usual ones."""
    n = ctx.facts.n_layer_all
    shallow = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=100)
    deep = PlacementView(tuple(["CPU"] * n), "CPU", frozenset(), 8192, n_past=2100)
    cal = _calibration()
    inv = Inventory((), HostSpec(16 * GiB, 16 * GiB, 0, "host"),
                    calibration=replace(cal, figures=(*cal.figures, *figures)))
    return 1 / predict(ctx.facts, costs, deep, inv).decode_tokens_s - 1 / predict(
        ctx.facts, costs, shallow, inv).decode_tokens_s


def test_ffn_kept_on_the_host_reads_there_and_crosses_twice_a_layer(gemma):
    """`-ot blk.N.ffn_(gate|up|down)=CPU` on a layer of RPC0: its FFN bytes stream at the host's rate and
    the activation goes to the CPU and back."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((_rpc(0),), HostSpec(16 * GiB, 16 * GiB, 0, "host"), calibration=_calibration("RPC0"))
    base = PlacementView(tuple(["RPC0"] * n), "RPC0", frozenset(), 1024, n_ubatch=128, n_past=0)
    moved = PlacementView(tuple(["RPC0"] * n), "RPC0", frozenset(), 1024, n_ubatch=128, n_past=0,
                          ffn_on_host=frozenset({2, 5}))
    p0, p1 = predict(ctx.facts, costs, base, inv), predict(ctx.facts, costs, moved, inv)
    assert p1.n_boundaries == p0.n_boundaries + 4
    ffn = sum(costs.layers[i].group_bytes(WeightGroup.FFN) for i in (2, 5))
    act = ctx.facts.n_embd * 4
    assert 1 / p1.decode_tokens_s - 1 / p0.decode_tokens_s == pytest.approx(
        ffn / 8e9 - ffn / 4e9 + 4 * (LATENCY_S + act / LINK))
    host = {s.device: s for s in p1.stages}["CPU"]
    assert host.bytes_per_token == ffn


def test_a_one_token_ubatch_streams_what_a_decoded_token_reads(gemma):
    """Prefill streams each ubatch's weights once: for one token, exactly the weights decode reads (the
    two are computed apart: decode_bytes and prefill_work)."""
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    view = PlacementView(tuple(["CPU"] * (n // 2) + ["RPC0"] * (n - n // 2)), "RPC0", frozenset(), 1024,
                         n_ubatch=1, n_past=0, op_offload=False)
    weights, _ = decode_bytes(ctx.facts, costs, view)
    work = prefill_work(ctx.facts, costs, view, None)
    assert work.streamed == pytest.approx({d: float(b) for d, b in weights.items()})


def test_an_estimate_with_ffn_weights_on_the_host_is_seen_as_such(gemma):
    """view_of_estimate reads `-ot blk.N.ffn_(gate|up|down).weight=CPU` off the estimate's moved tensors:
    every layer's FFN on the host, 2 boundaries a layer plus the one into RPC0 (calibrate's FFN-on-host run)."""
    ctx, costs = gemma
    inv = Inventory((_rpc(0),), HostSpec(16 * GiB, 16 * GiB, 0, "host"), calibration=_calibration("RPC0"))
    flags = parse_llama_flags(["--rpc", "127.0.0.1:50052", "-dev", "RPC0", "-ngl", "999", "-c", "512",
                               "-ot", FFN_ON_HOST])
    est = estimate(ctx, flags, inv)
    view = view_of_estimate(ctx, est)
    assert view.ffn_on_host == frozenset(range(ctx.facts.n_layer))
    assert predict(ctx.facts, costs, view, inv).n_boundaries == 2 * ctx.facts.n_layer + 1
