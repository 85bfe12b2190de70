"""A plan read back from its document keeps the memory pool Host and the UMA devices share (seed
003 §7), and every verdict on such a document — validate, report, serve, the API — judges that pool,
not each row alone.

The case: a tiny llama (tests/planner/search/test_pools.py's, about 62 MiB of weights) planned on
configs/devices/strix-halo.yaml with a 150 MiB pool (it keeps every layer on Host). The tests then
offload half the layers and set every budget, the pool too, to 110 MiB: each row alone is within its
own budget, Host and Vulkan0 together are not, so only the pool can say "does not fit".
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.api import validate as api_validate
from planner.checking.validation_report import DeviceReport, judge
from planner.cli import main
from planner.core.errors import InfeasiblePlacement
from planner.core.units import MiB
from planner.emit.document import read_deployment
from planner.memory.estimate import estimate
from planner.running.serve import ServeRequest, prepare_serve
from planner.synth.gguf_factory import llama_spec
from tests.support.overhead import VULKAN_MIB

STRIX = str(Path(__file__).parents[3] / "configs" / "devices" / "strix-halo.yaml")
POOL = (150 + VULKAN_MIB) * MiB   # 150 MiB beside the APU's Vulkan overhead, which the plan counts in the pool
# At -ngl 4 (-c 4096) the estimate puts about 59 MiB on Vulkan0 (23 weights, 12 KV, 24 compute) and
# 86 MiB on Host (38, 20, 28): 145 MiB together, within POOL; each alone is within TIGHT, both
# together are 35 MiB over it. These are the case's premises, not expected figures: the wide
# margins keep them true under small estimate changes, and test_the_case_is_within_each_row_and_over_the_pool
# checks them.
TIGHT = 110 * MiB


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    [path] = llama_spec(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=2816, n_vocab=4096).write(
        tmp_path_factory.mktemp("pool-verdicts") / "llama.gguf")
    return str(path)


@pytest.fixture(scope="module")
def plan_file(model: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.yaml"
    code = main(["plan", model, "--devices", STRIX, "-c", "4096", "--max-vram", f"Vulkan0={POOL}B",
                 "--max-ram", f"{POOL}B", "-o", str(out)])
    assert code == 0
    return out


def _doc(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _pooled(doc: dict) -> int:
    """What Host (every host row) and Vulkan0 hold together, from the plan's rows."""
    return sum(r["model_bytes"] + r["context_bytes"] + r["compute_bytes"] for r in doc["devices"]
               if r["name"] in ("Host", "CPU_REPACK", "Vulkan0"))


def _offload_four(argv: list[str]) -> list[str]:
    i = argv.index("-ngl")
    return [*argv[:i + 1], "4", *argv[i + 2:]]


def _tight(plan_file: Path, tmp_path: Path) -> Path:
    """The plan with 4 of its 8 layers on Vulkan0 and every budget, the pool too, at TIGHT."""
    doc = _doc(plan_file)
    doc["argv"] = _offload_four(doc["argv"])
    doc["budgets"] = {"devices": {"Vulkan0": TIGHT}, "host_bytes": TIGHT, "uma_pool_bytes": TIGHT,
                      "pool_devices": ["Vulkan0"]}
    out = tmp_path / "tight.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def test_a_uma_plan_read_back_keeps_its_pool(plan_file: Path) -> None:
    doc = _doc(plan_file)
    assert doc["budgets"]["uma_pool_bytes"] == POOL
    assert doc["budgets"]["pool_devices"] == ["Vulkan0"]
    dep = read_deployment(str(plan_file))
    limits = dep.limits
    assert limits.uma_pool_bytes == POOL and limits.pool_devices == ("Vulkan0",)
    assert limits.host_bytes == POOL and limits.devices == {"Vulkan0": POOL}
    # the plan itself fits its pool
    assert _pooled(doc) <= POOL


def test_the_case_is_within_each_row_and_over_the_pool(plan_file: Path, tmp_path: Path) -> None:
    dep = read_deployment(str(_tight(plan_file, tmp_path)))
    est = estimate(dep.model_path, dep.flags, dep.inventory)
    rows = {d.name: d.total_bytes for d in est.devices}
    assert set(rows) == {"Vulkan0", "Host"}
    assert 0 < rows["Vulkan0"] <= TIGHT and 0 < rows["Host"] <= TIGHT
    assert TIGHT < rows["Vulkan0"] + rows["Host"] <= POOL


def test_an_old_document_without_the_pool_still_reads(plan_file: Path, tmp_path: Path) -> None:
    doc = _doc(plan_file)
    del doc["budgets"]["uma_pool_bytes"], doc["budgets"]["pool_devices"]
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(doc, sort_keys=False))
    dep = read_deployment(str(old))
    assert dep.budgets == {"Vulkan0": POOL, "Host": POOL}
    assert dep.uma_pool_bytes is None and dep.pool_devices == ()
    assert dep.limits.uma_pool_bytes is None


def test_validate_says_the_pool_does_not_fit(plan_file: Path, tmp_path: Path, capsys) -> None:
    tight = _tight(plan_file, tmp_path)
    code = main(["validate", str(tight), "--reserve-only", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1, err
    doc = json.loads(out)
    assert doc["fits"] is False
    assert doc["verdict"].startswith("does not fit in the 110 MiB pool Host and Vulkan0 share by ")
    # every row alone is within its own budget: the pool is what failed
    assert all(d["weights_bytes"] + d["kv_bytes"] + d["compute_bytes"] <= d["budget_bytes"]
               for d in doc["devices"] if d["budget_bytes"] is not None)


def test_validate_of_the_plan_as_written_fits(plan_file: Path, capsys) -> None:
    code = main(["validate", str(plan_file), "--reserve-only", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["fits"] is True


def test_the_api_judges_the_pool(plan_file: Path, tmp_path: Path) -> None:
    tight = _tight(plan_file, tmp_path)
    report = api_validate(str(tight))
    assert not report.fits and "pool" in report.verdict


def test_the_api_keeps_the_pool_of_an_inventory(model: str) -> None:
    # --ram 2158MiB: the host's budget is 2158 MiB less the 2 GiB reserve (seed 002), 110 MiB, and
    # so is the pool and Vulkan0's budget (capped at the host's)
    report = api_validate(model, "-c 4096 -ngl 4", STRIX, ram=f"{2048 + 110}MiB", n_prompt=4, n_gen=1)
    assert {d.name: d.budget_bytes for d in report.devices} == {"Vulkan0": TIGHT, "Host": TIGHT}
    assert not report.fits and report.verdict.startswith("does not fit in the 110 MiB pool Host and Vulkan0 share")


def test_report_says_the_pool_does_not_fit(plan_file: Path, tmp_path: Path) -> None:
    tight = _tight(plan_file, tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(tight), "-o", str(page)]) == 0
    html = page.read_text()
    assert "does not fit" in html and "pool" in html


def test_serve_refuses_budgets_whose_pool_the_plan_overruns(plan_file: Path) -> None:
    # --max-ram 110MiB: the pool is 110 MiB, and so is Vulkan0's budget (capped at the host's)
    pool_message = "Host and Vulkan0 need .* MiB together, the pool they share is 110 MiB"
    with pytest.raises(InfeasiblePlacement, match=pool_message):
        prepare_serve(ServeRequest(str(plan_file), extra=("-ngl", "4"), max_ram=f"{TIGHT}B", check_hardware=False))
    # the plan's own 150 MiB pool holds the same flags
    prepare_serve(ServeRequest(str(plan_file), extra=("-ngl", "4"), max_ram=f"{POOL}B", check_hardware=False))


def test_judge_charges_the_pool_to_host() -> None:
    devices = (DeviceReport("Vulkan0", 60 * MiB, 0, 0, None, 100 * MiB, 0.0),
               DeviceReport("Host", 50 * MiB, 0, 0, None, 100 * MiB, 0.0))
    assert judge(devices).fits
    verdict = judge(devices, uma_pool_bytes=100 * MiB, pool_devices=("Vulkan0",))
    assert not verdict.fits
    assert verdict.text == "does not fit in the 100 MiB pool Host and Vulkan0 share by 10 MiB"
