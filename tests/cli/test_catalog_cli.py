"""`fitplan catalog`, catalog devices and rates on the command line (`--device CUDA0=rtx3060`,
`CUDA0=12GiB,bw=360,tflops=51`), one card under two backends (`id:`), and the estimate's shared-pool
verdict on an APU."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.hardware.catalog import load_catalog
from planner.synth.gguf_factory import llama_spec

GiB = 2**30
# The families issue 18 asks the catalog for, one id each (laptop variants, memory sizes, every vendor)
REQUIRED_IDS = (
    "rtx2080ti", "rtx3060", "rtx3060-8gb", "rtx3060-laptop", "rtx4060ti-16gb", "rtx4090-laptop", "rtx5080",
    "rtx5090-laptop", "v100-sxm2-32gb", "a10", "a100-40gb-sxm", "a100-80gb-sxm", "l4", "l40s", "h100-pcie",
    "h100-sxm", "h200-sxm", "b200", "rx6800xt", "rx7900xtx", "rx9070xt", "mi210", "mi250", "mi300x", "arc-a770-16gb",
    "arc-b580", "m1", "m2-pro", "m3-max", "m4-max", "m2-ultra", "ryzen-8700g", "ryzen-ai-9-hx370", "ryzen-ai-max-395",
    "ddr4-3200-2ch", "ddr5-6000-12ch",
)
FIGURES = ("memory_bytes", "bandwidth_bytes_s", "fp16_flops", "link_bytes_s")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    [path] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(
        tmp_path_factory.mktemp("catalog_cli") / "m.gguf")
    return str(path)


def test_catalog_json_lists_every_entry_with_its_source(capsys):
    code, out, _ = run(capsys, "catalog", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    entries = doc["entries"]
    assert doc["count"] == len(entries) >= 80
    ids = {e["id"] for e in entries}
    assert set(REQUIRED_IDS) <= ids
    for e in entries:
        assert e["source"].strip(), e["id"]
        # a figure is a positive number or empty (the source gives none): never 0, never a guess
        assert all(e[k] is None or (isinstance(e[k], int) and e[k] > 0) for k in FIGURES), e["id"]
    cat = load_catalog()
    assert len(entries) == len(cat.devices) + len(cat.hosts)


def test_catalog_figures_are_the_files(capsys):
    code, out, _ = run(capsys, "catalog", "--match", "rtx3060", "--format", "json")
    assert code == 0
    by_id = {e["id"]: e for e in json.loads(out)["entries"]}
    assert set(by_id) == {"rtx3060", "rtx3060-8gb", "rtx3060ti", "rtx3060-laptop"}
    # 12 GB GDDR6 at 15 Gbps on 192 bits: 15e9 x 192 / 8 = 360 GB/s; NVIDIA publishes no fp16 figure for it
    assert by_id["rtx3060"]["memory_bytes"] == 12 * GiB
    assert by_id["rtx3060"]["bandwidth_bytes_s"] == 360 * 10**9
    assert by_id["rtx3060"]["fp16_flops"] is None
    # a laptop GPU's memory clock is the laptop maker's: no bandwidth
    assert by_id["rtx3060-laptop"]["bandwidth_bytes_s"] is None


def test_catalog_kind_and_match_filters(capsys):
    code, out, _ = run(capsys, "catalog", "--kind", "host", "--format", "json")
    assert code == 0
    hosts = json.loads(out)["entries"]
    assert hosts and {e["kind"] for e in hosts} == {"host"}
    code, out, _ = run(capsys, "catalog", "--kind", "igpu", "--format", "json")
    igpus = json.loads(out)["entries"]
    assert {e["kind"] for e in igpus} == {"igpu"} and all(e["uma"] for e in igpus)
    code, out, _ = run(capsys, "catalog", "--match", "Radeon 890M")
    assert code == 0 and "ryzen-ai-9-hx370" in out and "1 entries" in out
    code, _, err = run(capsys, "catalog", "--kind", "tpu")
    assert code == 2 and "--kind 'tpu': expected gpu, igpu or host" in err


def test_a_catalog_card_on_the_command_line_plans(capsys, model):
    code, out, err = run(capsys, "plan", model, "--device", "CUDA0=rtx3060", "--ram", "32GiB", "--ctx", "1024",
                         "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    cuda = next(d for d in doc["devices"] if d["name"] == "CUDA0")
    assert cuda["model_bytes"] > 0 and cuda["budget_bytes"] == 12 * GiB - 512 * 2**20
    assert doc["argv"][doc["argv"].index("-dev") + 1] == "CUDA0"


def test_rates_on_the_command_line(capsys):
    code, out, err = run(capsys, "devices", "--device", "CUDA0=12GiB,bw=360,tflops=51", "--ram", "32GiB",
                         "--format", "json")
    assert code == 0, err
    [dev] = json.loads(out)["devices"]
    assert (dev["total_bytes"], dev["bandwidth_bytes_s"], dev["fp16_flops"]) == (12 * GiB, 360 * 10**9, 51 * 10**12)
    # rates over a catalog card's figures; the rest stay the catalog's
    code, out, _ = run(capsys, "devices", "--device", "CUDA0=rtx3090,bw=900", "--ram", "32GiB", "--format", "json")
    [dev] = json.loads(out)["devices"]
    assert (dev["bandwidth_bytes_s"], dev["fp16_flops"], dev["total_bytes"]) == (900 * 10**9, 71 * 10**12, 24 * GiB)


@pytest.mark.parametrize("spec, expected", [
    ("CUDA0=12GiB,bandwidth=360", "expected KEY=VALUE with KEY one of bw, tflops, link, free, id"),
    ("CUDA0=12GiB,bw=fast", "bw: expected"),
    ("CUDA0=12GiB,free=13GiB", "free"),
    ("2xrtx3090,id=0000:01:00.0", "expected one device with id="),
])
def test_bad_rates_exit_2(capsys, spec, expected):
    code, _, err = run(capsys, "devices", "--device", spec, "--ram", "32GiB")
    assert code == 2 and expected in err, err


def test_one_card_under_two_backends_in_a_yaml_inventory(capsys, tmp_path):
    inv = tmp_path / "dual.yaml"
    inv.write_text("host: {ram: 64GiB}\n"
                   "devices:\n"
                   "  - {name: CUDA0, catalog: rtx3090, id: '0000:01:00.0'}\n"
                   "  - {name: Vulkan0, catalog: rtx3090, id: '0000:01:00.0'}\n")
    code, out, err = run(capsys, "devices", "--devices", str(inv), "--format", "json")
    assert code == 0, err
    devices = json.loads(out)["devices"]
    assert [(d["name"], d["backend"], d["id"]) for d in devices] == [
        ("CUDA0", "CUDA", "0000:01:00.0"), ("Vulkan0", "Vulkan", "0000:01:00.0")]
    # llama.cpp registers CUDA before Vulkan and skips a device whose id it has seen
    doc = json.loads(out)
    assert doc["device_order"] == ["CUDA0"]
    assert doc["same_cards"] == [{"skipped": "Vulkan0", "used": "CUDA0", "id": "0000:01:00.0"}]
    assert doc["llama_flags"].count(",") == 0   # one --fit-target margin: one device
    code, out, _ = run(capsys, "devices", "--devices", str(inv))
    assert "Vulkan0 is CUDA0 (one card, id 0000:01:00.0): llama.cpp uses CUDA0" in out


def test_estimate_checks_host_and_apu_against_their_one_pool(capsys, model):
    # Vulkan0 is an APU (uma): Host and Vulkan0 share 2 GiB of RAM. Each alone is within 2 GiB; a
    # 1.5 GiB budget on each would let 3 GiB through, so the verdict is on their sum.
    args = ("estimate", model, "--device", "Vulkan0=ryzen-8700g", "--ram", "4GiB", "--max-ram", "2GiB",
            "--max-vram", "Vulkan0=2GiB", "--format", "json", "--", "-c", "1024", "-ngl", "1")
    code, out, err = run(capsys, *args)
    doc = json.loads(out)
    pool = doc["shared_pool"]
    assert pool["devices"] == ["Host", "Vulkan0"] and pool["budget_bytes"] == 2 * GiB
    # each row with the overhead its process holds outside llama.cpp's breakdown (the APU's is pool RAM too)
    totals = {d["name"]: d["model_bytes"] + d["context_bytes"] + d["compute_bytes"] + d["overhead_bytes"]
              for d in doc["devices"]}
    assert pool["bytes"] == totals["Host"] + totals.get("CPU_REPACK", 0) + totals["Vulkan0"]
    assert code == 0 and doc["fits"]
    code, out, _ = run(capsys, *args[:8], "--max-ram", f"{pool['bytes'] - totals['Vulkan0'] + 1}B",
                       *args[10:])
    doc = json.loads(out)
    assert code == 1 and not doc["fits"] and doc["shared_pool"]["bytes"] > doc["shared_pool"]["budget_bytes"]
