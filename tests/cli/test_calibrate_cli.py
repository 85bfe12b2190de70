"""`fitplan calibrate` on this machine: it runs the pinned llama-bench on a tiny model (few repeats),
writes an inventory that `plan` loads, and the plan's prediction says it used calibrated rates.
Nothing here asserts a timing."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.synth.tiny_models import Dims, write_tiny

# the pinned llama.cpp tools, built once a session where missing (tests/conftest.py llama_tools) before the
# test runs, never looked for at collection: a tool that cannot be built fails the test instead of skipping it
needs_tools = pytest.mark.usefixtures("llama_tools")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def calibrated(llama_tools: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("calibrate")
    model = write_tiny(d / "tiny.gguf", "llama")
    out = d / "inventory.yaml"
    code = main(["calibrate", "--model", str(model), "--repeats", "1", "--rounds", "2", "--prompt-tokens", "32",
                 "--gen-tokens", "4", "-o", str(out)])
    assert code == 0
    return model, out


@needs_tools
def test_calibrate_writes_an_inventory_with_the_method_next_to_each_figure(calibrated):
    _, out = calibrated
    doc = yaml.safe_load(out.read_text())
    block = doc["calibrated"]
    assert {"date", "method", "tool"} <= set(block)
    assert "llama-bench" in block["tool"] and "0c1e570" in block["tool"]
    assert "the fastest sample of the repeats of 2 llama-bench processes a placement, run round-robin" \
        in block["method"]
    for key in ("bandwidth_gbs", "fp16_tflops"):
        figure = block["host"][key]
        assert figure["value"] > 0 and figure["how"]


@needs_tools
def test_plan_uses_the_calibrated_inventory_and_says_so(capsys, calibrated):
    model, out = calibrated
    code, text, _ = run(capsys, "plan", str(model), "--devices", str(out), "--ctx", "256")
    assert code == 0
    [predicted] = [line for line in text.splitlines() if line.startswith("predicted:")]
    assert "calibrated" in predicted


@needs_tools
def test_a_wrong_key_in_the_calibrated_block_is_exit_2_with_one_line(capsys, calibrated, tmp_path):
    model, out = calibrated
    doc = yaml.safe_load(out.read_text())
    doc["calibrated"]["host"]["bandwith_gbs"] = doc["calibrated"]["host"].pop("bandwidth_gbs")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, allow_unicode=True))
    code, _, err = run(capsys, "plan", str(model), "--devices", str(bad), "--ctx", "256")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "calibrated.host.bandwith_gbs: unknown key (did you mean 'bandwidth_gbs'?)" in err


def test_rounds_run_each_placement_in_its_own_process_and_take_the_median(llama_tools, tmp_path):
    from planner.measuring.llama_bench import BenchJob, Workload, median_timing, run_rounds

    model = str(write_tiny(tmp_path / "tiny.gguf", "llama"))
    work = Workload(16, 4, 0, 1, 1)
    jobs = [BenchJob(model, ("-ngl", "0"), work), BenchJob(model, ("-ngl", "0", "-ub", "8"), work)]
    started: list[int] = []
    rounds = run_rounds(llama_tools, jobs, [], 3, started.append)
    assert started == [1, 2, 3]
    assert [len(r) for r in rounds] == [3, 3]
    assert [t.n_ubatch for t in rounds[1]] == [8, 8, 8]
    for timings in rounds:
        for t in timings:   # every sample llama-bench reported (one per repeat), and their median
            assert len(t.tg_samples) == len(t.pp_samples) == work.repeats
            assert (t.tg_tokens_s, t.pp_tokens_s) == (t.tg_samples[0], t.pp_samples[0])
        med = median_timing(timings)
        assert med.tg_tokens_s == sorted(t.tg_tokens_s for t in timings)[1]
        assert med.pp_tokens_s == sorted(t.pp_tokens_s for t in timings)[1]


@needs_tools
def test_each_placement_is_its_fastest_sample_unless_the_median_is_asked(tmp_path):
    """calibrate's default figure of a placement is the fastest of its samples (a sample on shared cores is
    only slowed by other work); --estimate median takes the median of the repeats; the method says which."""
    from planner.measuring.calibrate import CalibrateRequest, calibrate
    from planner.measuring.llama_bench import Workload

    model = str(write_tiny(tmp_path / "tiny.gguf", "llama"))
    work = Workload(32, 4, 0, 3, 1)
    fastest = calibrate(CalibrateRequest(model=model, work=work))
    median = calibrate(CalibrateRequest(model=model, work=work, estimate="median"))
    for r in fastest.runs:
        assert len(r.timing.tg_samples) == len(r.timing.pp_samples) == 3
        assert (r.timing.tg_tokens_s, r.timing.pp_tokens_s) == (max(r.timing.tg_samples), max(r.timing.pp_samples))
    for r in median.runs:
        assert len(r.timing.tg_samples) == 3
        assert r.timing.tg_tokens_s == sorted(r.timing.tg_samples)[1]
        assert r.timing.pp_tokens_s == sorted(r.timing.pp_samples)[1]
    assert fastest.inventory.calibration is not None and median.inventory.calibration is not None
    assert "; the fastest sample of the repeats (a sample on shared cores" in fastest.inventory.calibration.method
    assert "; medians of the repeats;" in median.inventory.calibration.method


@needs_tools
def test_timings_measured_elsewhere_fit_to_the_same_figures(tmp_path):
    """bench_throughput runs calibrate's placements in its own rounds (calibration_jobs) and hands the
    timings to calibrate: the fit is the one calibrate makes of the same timings, and the method says where
    they came from."""
    from planner.measuring.calibrate import CalibrateRequest, calibrate, calibration_jobs
    from planner.measuring.llama_bench import Workload

    model = str(write_tiny(tmp_path / "tiny.gguf", "llama"))
    request = CalibrateRequest(model=model, work=Workload(32, 4, 0, 1, 1))
    ran = calibrate(request)
    from planner.hardware.detect import detect_inventory

    jobs = calibration_jobs(request, detect_inventory([]))
    assert list(jobs) == [r.name for r in ran.runs]
    assert [(j.flags, j.work.n_depth) for j in jobs.values()] == [(r.flags, r.depth) for r in ran.runs]
    again = calibrate(request, measured={r.name: r.timing for r in ran.runs}, measured_how="from elsewhere")
    assert again.inventory.calibration is not None and ran.inventory.calibration is not None
    assert [(f.device, f.quantity, f.value) for f in again.inventory.calibration.figures] == \
        [(f.device, f.quantity, f.value) for f in ran.inventory.calibration.figures]
    assert again.inventory.calibration.method.endswith("(from elsewhere)")
    assert "load average" in ran.inventory.calibration.method


@needs_tools
def test_the_attention_probe_runs_at_both_depths_and_prices_attention_only(tmp_path):
    """With --attention-probe (a model of 128-wide heads beside the tiny llama's 32-wide ones) the probe runs on the
    host at depths 0 and 2048 and gives attention's figures only: the bandwidth and FLOPs are fitted over the
    calibration model's two runs, not four. Attention comes out as one sweep rate over both models' depth runs
    (none where noise makes the depth no slower), never the older per-pair and per-value figures; the method
    names the probe either way."""
    from planner.hardware.inventory import Quantity
    from planner.measuring.calibrate import CalibrateRequest, calibrate
    from planner.measuring.llama_bench import Workload

    model = str(write_tiny(tmp_path / "tiny.gguf", "llama"))
    probe = str(write_tiny(tmp_path / "probe.gguf", "llama", Dims(head_dim=128)))
    request = CalibrateRequest(model=model, work=Workload(32, 4, 0, 2, 1), probe=probe)
    with_probe = calibrate(request)
    names = [r.name for r in with_probe.runs]
    assert names == ["host", "host, depth 2048", "probe: host", "probe: host, depth 2048"]
    assert [r.probe for r in with_probe.runs] == [False, False, True, True]
    cal = with_probe.inventory.calibration
    assert cal is not None
    fitted = {f.quantity: f.how for f in cal.figures if f.device == "CPU"}
    for quantity in (Quantity.BANDWIDTH, Quantity.FLOPS):
        assert f"least squares over 2 placements of {model}" in fitted[quantity]
    assert not {f.quantity for f in cal.figures} & {Quantity.ATTENTION_CELLS, Quantity.ATTENTION_VALUES}
    sweep = [f for f in cal.figures if f.quantity is Quantity.ATTENTION_SWEEP]
    assert len(sweep) <= 1 and all(f"and the probe {probe}" in f.how and f.value > 0 for f in sweep)
    assert f"and the probe {probe}" in cal.method and "probe: host, depth 2048" in cal.method


def test_an_unknown_estimate_is_exit_2_with_one_line(capsys):
    code, _, err = run(capsys, "calibrate", "--estimate", "mean")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "'mean' is not one of 'fastest', 'median'" in err
