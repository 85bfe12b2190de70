"""`fitplan sd-fit` end to end: every example command of seed 002, with hand-derived plans.

The model is synthetic (a real safetensors header, sparse zero data):
  diffusion  40 x F16[64 Mi] = 5 GiB        + 40 x 64 B   (largest tensor 128 MiB + 64 B)
  te         16 x F16[64 Mi] = 2 GiB        + 16 x 64 B   (largest 128 MiB + 64 B)
  vae         1 x F32[40 Mi] = 160 MiB      +  1 x 64 B
(64 B per tensor: stable-diffusion.cpp backend_fit.cpp). Compute reserves: 2, 2, 1 GiB.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest

from planner.cli import main
from planner.synth.safetensors_factory import write_safetensors

KiB, MiB, GiB = 1024, 1024**2, 1024**3
D = 5 * GiB + 40 * 64
T = 2 * GiB + 16 * 64
V = 160 * MiB + 64
RAM = ["--ram", "32GiB"]  # RAM budget: 32 - max(2, 3.2) = 28.8 GiB


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    t = {f"model.diffusion_model.double_blocks.{i}.img_attn.qkv.weight": ("F16", [1024, 64 * 1024]) for i in range(40)}
    t.update({f"text_encoders.t5xxl.transformer.encoder.block.{i}.layer.0.w": ("F16", [64 * MiB]) for i in range(16)})
    t["first_stage_model.decoder.conv_in.weight"] = ("F32", [40 * MiB])   # F16: 2 bytes an element, F32: 4
    return str(write_safetensors(tmp_path_factory.mktemp("sd") / "model.safetensors", t))


def run(capsys, *args):
    code = main(["sd-fit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def plan(capsys, model, *args):
    code, out, err = run(capsys, model, "--format", "json", *args)
    assert code == 0, err
    return json.loads(out)


def placed(p):
    return {c["module"]: (c["compute"], c["params"]) for c in p["components"]}


def test_component_sizes_and_reserves(capsys, model):
    p = plan(capsys, model, "--device", "CUDA0=24GiB", *RAM)
    assert [(c["module"], c["params_bytes"], c["compute_reserve_bytes"]) for c in p["components"]] == [
        ("diffusion", D, 2 * GiB), ("te", T, 2 * GiB), ("vae", V, 1 * GiB)]
    assert p["ram"] == {"free_bytes": 32 * GiB, "params_budget_bytes": 32 * GiB - int(32 * GiB * 0.10)}


def test_auto_fit_on_everything_resident(capsys, model):
    # sd-cli ... --auto-fit on. budget 12 GiB - 512 MiB = 11.5 GiB;
    # diffusion: D <= 11.5 - (2 GiB + te staging 128 MiB); te: T <= 6.5 - 2; vae: V <= 4.5 - 2
    p = plan(capsys, model, "--auto-fit", "on", "--device", "CUDA0=12GiB", *RAM)
    assert p["mode"] == "auto-fit"
    assert p["devices"] == [{"name": "CUDA0", "free_bytes": 12 * GiB, "budget_bytes": 12 * GiB - 512 * MiB}]
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA0", "CUDA0"), "vae": ("CUDA0", "CUDA0")}
    assert p["params_backend"] == "" and p["traffic_bytes_per_image"] == 0 and p["warnings"] == []
    assert p["flags"] == "--backend diffusion=CUDA0,te=CUDA0,vae=CUDA0 --auto-fit off"


def test_max_vram_budgets_choose_the_main_gpu(capsys, model):
    # sd-cli ... --auto-fit on --max-vram cuda0=8,cuda1=14: CUDA0 has more free memory, CUDA1 the
    # larger budget -> compute on CUDA1.
    p = plan(capsys, model, "--auto-fit", "on", "--max-vram", "cuda0=8,cuda1=14",
             "--device", "CUDA0=24GiB", "--device", "CUDA1=16GiB", *RAM)
    assert [d["budget_bytes"] for d in p["devices"]] == [8 * GiB, 14 * GiB]
    assert {c for c, _ in placed(p).values()} == {"CUDA1"}
    assert "--max-vram CUDA0=8.0,CUDA1=14.0" in p["flags"]


@pytest.mark.parametrize("max_vram,budget", [
    (None, 12 * GiB - 512 * MiB),   # unset: free - 512 MiB
    ("-2", 10 * GiB),               # negative: free - 2 GiB
    ("20", 12 * GiB),               # positive: min(20 GiB, free)
    ("6.5", 6 * GiB + 512 * MiB),
    ("cuda0=0", 12 * GiB - 512 * MiB),  # 0 means unset in sd-cli
    ("5,cuda0=-1", 11 * GiB),       # a device's own value wins over the bare default
])
def test_budget_semantics(capsys, model, max_vram, budget):
    args = ["--max-vram", max_vram] if max_vram else []
    p = plan(capsys, model, "--device", "CUDA0=12GiB", *RAM, *args)
    assert p["devices"][0]["budget_bytes"] == budget


def test_backend_cpu_for_every_module(capsys, model):
    # sd-cli ... --backend cpu: CPU modules keep parameters in RAM (28.8 GiB budget holds all)
    p = plan(capsys, model, "--backend", "cpu", "--device", "CUDA0=24GiB", *RAM)
    assert placed(p) == {"diffusion": ("cpu", "cpu"), "te": ("cpu", "cpu"), "vae": ("cpu", "cpu")}


def test_per_module_backends_kept(capsys, model):
    # sd-cli ... --backend te=cpu,vae=cuda0,diffusion=vulkan0
    p = plan(capsys, model, "--backend", "te=cpu,vae=cuda0,diffusion=vulkan0",
             "--device", "CUDA0=12GiB", "--device", "Vulkan0=8GiB", *RAM)
    # diffusion on Vulkan0 (7.5 GiB budget, only its own 2 GiB reserve there): D <= 5.5 GiB -> resident
    assert placed(p) == {"diffusion": ("Vulkan0", "Vulkan0"), "te": ("cpu", "cpu"), "vae": ("CUDA0", "CUDA0")}
    assert p["backend"] == "diffusion=Vulkan0,te=cpu,vae=CUDA0"


def test_params_backend_te_vae_cpu_disables_auto_fit(capsys, model):
    # sd-cli ... --backend cuda0 --params-backend te=cpu,vae=cpu
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "te=cpu,vae=cpu", "--device", "CUDA0=12GiB", *RAM)
    assert p["mode"] == "manual"
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA0", "cpu"), "vae": ("CUDA0", "cpu")}
    # the bare default is kept first: it still applies to modules sd-fit does not place
    assert p["flags"] == "--backend all=CUDA0,diffusion=CUDA0,te=CUDA0,vae=CUDA0 --params-backend te=cpu,vae=cpu"


def test_params_backend_disk(capsys, model):
    # sd-cli ... --backend cuda0 --params-backend disk
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "disk", "--device", "CUDA0=12GiB", *RAM)
    assert {params for _, params in placed(p).values()} == {"disk"}
    assert p["params_backend"] == "all=disk,diffusion=disk,te=disk,vae=disk"


def test_params_backend_cpu(capsys, model):
    # sd-cli ... --backend cuda0 --params-backend cpu: runs on cuda0, parameters in RAM
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "cpu", "--device", "CUDA0=12GiB", *RAM)
    assert placed(p) == {k: ("CUDA0", "cpu") for k in ("diffusion", "te", "vae")}
    assert p["warnings"] == []  # 7329 MiB in RAM, within its 28.8 GiB budget
    # cached once per image: CUDA0 budget 11.5 GiB holds each component's weights + reserve
    assert p["traffic_bytes_per_image"] == D + T + V


def test_max_vram_on_resolved_device_names(capsys, model):
    # sd-cli ... --backend diffusion=cuda0,vae=vulkan0 --max-vram cuda0=6,vulkan0=2
    p = plan(capsys, model, "--backend", "diffusion=cuda0,vae=vulkan0", "--max-vram", "cuda0=6,vulkan0=2",
             "--device", "CUDA0=12GiB", "--device", "Vulkan0=8GiB", *RAM)
    assert [d["budget_bytes"] for d in p["devices"]] == [6 * GiB, 2 * GiB]
    # te (unassigned) computes on the larger budget, CUDA0. diffusion: D > 6 - (2 GiB + 128 MiB) -> RAM;
    # te: offloaded diffusion keeps 2 + 5 GiB > 6 -> RAM; vae on Vulkan0: V <= 2 - 1 -> resident
    assert placed(p) == {"diffusion": ("CUDA0", "cpu"), "te": ("CUDA0", "cpu"), "vae": ("Vulkan0", "Vulkan0")}


def test_all_default_with_te_on_cpu(capsys, model):
    # sd-cli ... --backend all=cuda0,te=cpu
    p = plan(capsys, model, "--backend", "all=cuda0,te=cpu", "--device", "CUDA0=8GiB", "--device", "CUDA1=24GiB", *RAM)
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("cpu", "cpu"), "vae": ("CUDA0", "CUDA0")}


def test_layer_split_device_list(capsys, model):
    # sd-cli ... --backend "diffusion=cuda0&cuda1": free 12 and 8 GiB, minus 2 GiB -> 10 : 6.
    # Block b (of 40) on CUDA0 while b/40 < 10/16 -> blocks [0, 25) on CUDA0, [25, 40) on CUDA1.
    p = plan(capsys, model, "--backend", "diffusion=cuda0&cuda1",
             "--device", "CUDA0=12GiB", "--device", "CUDA1=8GiB", *RAM)
    assert placed(p)["diffusion"] == ("CUDA0&CUDA1", "CUDA0&CUDA1")
    per_block = 128 * MiB + 64
    assert p["splits"]["diffusion"] == [
        {"mode": "layer", "device": "CUDA0", "first_block": 0, "end_block": 25, "bytes": 25 * per_block},
        {"mode": "layer", "device": "CUDA1", "first_block": 25, "end_block": 40, "bytes": 15 * per_block}]
    assert p["backend"].startswith("diffusion=CUDA0&CUDA1,")


def test_backend_cuda0_with_auto_fit(capsys, model):
    # sd-cli ... --backend cuda0: compute stays on CUDA0 (budget 7.5 GiB) though CUDA1 is larger.
    # diffusion resident (D <= 7.5 - 2.125); te: T > 2.5 - 2 -> RAM; vae: 2 + T > 2.5 -> RAM
    p = plan(capsys, model, "--backend", "cuda0", "--device", "CUDA0=8GiB", "--device", "CUDA1=24GiB", *RAM)
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA0", "cpu"), "vae": ("CUDA0", "cpu")}
    assert p["flags"] == "--backend all=CUDA0,diffusion=CUDA0,te=CUDA0,vae=CUDA0 --params-backend te=cpu,vae=cpu"


def test_other_modules_assignments_are_kept_and_validated(capsys, model):
    # seed 002: auto-fit preserves explicit --backend assignments (controlnet, upscaler, ...)
    base = [model, "--device", "CUDA0=12GiB", "--device", "CUDA1=12GiB", *RAM]
    p = plan(capsys, *base, "--backend", "control=cuda1,ESRGAN=cpu")
    assert p["backend"] == "controlnet=CUDA1,upscaler=cpu,diffusion=CUDA0,te=CUDA0,vae=CUDA0"
    code, _, err = run(capsys, *base, "--backend", "controlnet=cuda9")
    assert code == 2 and "'cuda9'" in err


def test_mixed_backends_with_auto_fit(capsys, model):
    # sd-cli ... --backend diffusion=cuda0,te=cpu,vae=cuda1
    p = plan(capsys, model, "--backend", "diffusion=cuda0,te=cpu,vae=cuda1", "--device", "CUDA0=12GiB",
             "--device", "CUDA1=8GiB", *RAM)
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("cpu", "cpu"), "vae": ("CUDA1", "CUDA1")}


def test_auto_fit_off_uses_the_runtime_backend(capsys, model):
    # sd-cli ... --auto-fit off: default backend (first GPU), parameters follow it, disk never implicit
    p = plan(capsys, model, "--auto-fit", "off", "--device", "CUDA0=4GiB", "--device", "CUDA1=24GiB", *RAM)
    assert p["mode"] == "manual"
    assert placed(p) == {k: ("CUDA0", "CUDA0") for k in ("diffusion", "te", "vae")}
    # ... and says it will not fit: weights 7328 MiB + 3648 B (rounded up), + 2 GiB compute
    assert p["warnings"] == ["CUDA0 needs 9377 MiB (weights 7329 + compute 2048) but its budget is 3584 MiB"]


def test_cpu_modules_with_matching_params(capsys, model):
    # sd-cli ... --backend diffusion=cuda0,te=cpu,vae=cpu --params-backend diffusion=cuda0,te=cpu,vae=cpu
    p = plan(capsys, model, "--backend", "diffusion=cuda0,te=cpu,vae=cpu",
             "--params-backend", "diffusion=cuda0,te=cpu,vae=cpu", "--device", "CUDA0=12GiB", *RAM)
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("cpu", "cpu"), "vae": ("cpu", "cpu")}


@pytest.mark.parametrize("order", ["params-first", "auto-fit-first"])
def test_explicit_params_disable_auto_fit_in_any_order(capsys, model, order):
    # seed 002: explicit --params-backend disables auto-fit "regardless of argument order, even with
    # --auto-fit on". On a 4 GiB GPU auto-fit would offload diffusion; as assigned, it stays.
    a, b = ["--params-backend", "te=cpu"], ["--auto-fit", "on"]
    args = a + b if order == "params-first" else b + a
    p = plan(capsys, model, *args, "--device", "CUDA0=4GiB", *RAM)
    assert p["mode"] == "manual"
    assert placed(p) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA0", "cpu"), "vae": ("CUDA0", "CUDA0")}


def test_offload_to_cpu_then_te_disk(capsys, model):
    # sd-cli --offload-to-cpu --params-backend te=disk == --params-backend '*=cpu,te=disk'
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "*=cpu,te=disk", "--device", "CUDA0=12GiB", *RAM)
    assert {k: v[1] for k, v in placed(p).items()} == {"diffusion": "cpu", "te": "disk", "vae": "cpu"}


def test_diffusion_larger_than_the_gpu_goes_to_ram(capsys, model):
    # seed 002: "--backend diffusion=cuda0 --params-backend diffusion=cpu when RAM is sufficient".
    # budget 5.5 GiB: D > 5.5 - 2.125 -> RAM; te and vae then see 2 + 5 GiB of headroom -> RAM.
    p = plan(capsys, model, "--device", "CUDA0=6GiB", *RAM)
    assert placed(p) == {k: ("CUDA0", "cpu") for k in ("diffusion", "te", "vae")}
    assert "--params-backend diffusion=cpu,te=cpu,vae=cpu" in p["flags"]


def test_no_ram_room_and_no_other_gpu_means_disk(capsys, model):
    # RAM 4 GiB -> budget 2 GiB: diffusion (5 GiB) cannot go to RAM and there is no other GPU
    p = plan(capsys, model, "--device", "CUDA0=6GiB", "--ram", "4GiB")
    assert placed(p)["diffusion"] == ("CUDA0", "disk")


def test_greedy_offloads_but_optimal_keeps_everything_resident(capsys, model):
    # Two 8 GiB GPUs (budgets 7.5), RAM 4 GiB (budget 2 GiB). Greedy computes all on CUDA0 (first on
    # a tie): diffusion resident (D <= 7.5 - 2.125); te: T > 2.5 - 2, T > 2 GiB RAM -> CUDA1;
    # vae: 2 + T (te offloaded) > 2.5 -> RAM.
    devs = ["--device", "CUDA0=8GiB", "--device", "CUDA1=8GiB", "--ram", "4GiB"]
    greedy = plan(capsys, model, *devs)
    assert placed(greedy) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA0", "CUDA1"), "vae": ("CUDA0", "cpu")}
    assert greedy["traffic_bytes_per_image"] == T + V
    # --optimal: te computes on CUDA1 (T + 2 <= 7.5), diffusion and vae on CUDA0 (D + V + 2 <= 7.5)
    best = plan(capsys, model, *devs, "--optimal")
    assert best["mode"] == "optimal"
    assert placed(best) == {"diffusion": ("CUDA0", "CUDA0"), "te": ("CUDA1", "CUDA1"), "vae": ("CUDA0", "CUDA0")}
    assert best["traffic_bytes_per_image"] == 0
    assert best["flags"] == "--backend diffusion=CUDA0,te=CUDA1,vae=CUDA0 --auto-fit off"


def test_text_format_reports_like_sd_cli(capsys, model):
    code, out, _ = run(capsys, model, "--device", "CUDA0=6GiB", *RAM)
    assert code == 0
    assert "auto-fit plan (compute on CUDA0):" in out
    assert "free   6144 MiB, budget   5632 MiB" in out
    assert "free  32768 MiB, params budget  29491 MiB" in out  # 28.8 GiB, whole MiB
    assert "DiT          params   5120 MiB, compute  2048 MiB (fixed reserve) -> compute CUDA0, params cpu" in out
    assert "512x512: fits with parameters on the host" in out
    assert ('auto-fit: --backend "diffusion=CUDA0,te=CUDA0,vae=CUDA0"'
            ' --params-backend "diffusion=cpu,te=cpu,vae=cpu"') in out


def test_flags_format(capsys, model):
    code, out, _ = run(capsys, model, "--format", "flags", "--device", "CUDA0=6GiB", *RAM)
    assert (code, out.strip()) == (0, "--backend diffusion=CUDA0,te=CUDA0,vae=CUDA0"
                                      " --params-backend diffusion=cpu,te=cpu,vae=cpu")


def test_yaml_format(capsys, model):
    code, out, _ = run(capsys, model, "--format", "yaml", "--device", "CUDA0=12GiB", *RAM)
    assert code == 0 and "mode: auto-fit" in out and f"params_bytes: {D}" in out


def test_separate_module_files(capsys, tmp_path):
    dit = str(write_safetensors(tmp_path / "dit.safetensors", {"double_blocks.0.w": ("BF16", [512 * MiB])}))
    vae = str(write_safetensors(tmp_path / "ae.safetensors", {"decoder.conv_in.weight": ("F32", [MiB])}))
    llm = str(write_safetensors(tmp_path / "llm.safetensors", {"model.layers.0.mlp.w": ("F16", [256 * MiB])}))
    code, out, err = run(capsys, "--diffusion-model", dit, "--vae", vae, "--llm", llm, "--format", "json",
                         "--device", "CUDA0=24GiB", *RAM)
    assert code == 0, err
    sizes = {c["module"]: c["params_bytes"] for c in json.loads(out)["components"]}
    assert sizes == {"diffusion": GiB + 64, "te": 512 * MiB + 64, "vae": 4 * MiB + 64}


@pytest.mark.parametrize("args,token", [
    (["--backend", "vae="], "'vae='"),
    (["--backend", "foo=cuda0"], "'foo'"),
    (["--backend", "disk"], "'disk'"),
    (["--params-backend", "te=cuda0&cuda1"], "'cuda0&cuda1'"),
    (["--params-backend", "vae="], "'vae='"),
    (["--backend", "diffusion=auto&cuda0"], "'auto'"),
    (["--backend", "cuda7"], "'cuda7'"),
    (["--params-backend", "te=vulkan3"], "'vulkan3'"),
    (["--max-vram", "cuda0=abc"], "'abc'"),
    (["--max-vram", "rocm0=4"], "'rocm0'"),
    (["--max-vram", "cuda0="], "'cuda0='"),
    (["--auto-fit", "maybe"], "'maybe'"),
    (["--format", "xml"], "'xml'"),
    (["--optimal", "--params-backend", "te=cpu"], "--optimal"),
    (["--optimal", "--auto-fit", "off"], "--optimal"),
])
def test_malformed_flags_exit_2_naming_the_token(capsys, model, args, token):
    code, out, err = run(capsys, model, "--device", "CUDA0=12GiB", *RAM, *args)
    assert code == 2 and out == ""
    assert token in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_ambiguous_device_prefix_is_refused(capsys, model):
    code, _, err = run(capsys, model, "--device", "CUDA0=12GiB", "--device", "CUDA1=12GiB", *RAM, "--backend", "cu")
    assert code == 2 and "'cu'" in err


def test_device_names_by_unique_prefix_registry_and_gpu(capsys, model):
    base = ["--device", "CUDA0=12GiB", "--device", "Vulkan0=12GiB", *RAM]
    assert placed(plan(capsys, model, *base, "--backend", "vul"))["te"][0] == "Vulkan0"
    assert placed(plan(capsys, model, *base, "--backend", "VULKAN"))["te"][0] == "Vulkan0"
    assert placed(plan(capsys, model, *base, "--backend", "gpu"))["te"][0] == "CUDA0"
    assert placed(plan(capsys, model, *base, "--backend", "auto"))["te"][0] == "CUDA0"


def test_hostile_safetensors_header(capsys, tmp_path):
    path = tmp_path / "evil.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 50) + b"{}")
    code, out, err = run(capsys, str(path), "--device", "CUDA0=12GiB", *RAM)
    assert code == 2 and out == ""
    assert "larger than the file" in err and len(err.strip().splitlines()) == 1


def test_missing_model(capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "none.safetensors"), "--device", "CUDA0=12GiB", *RAM)
    assert code == 2 and "no such model file" in err
    code, _, err = run(capsys, "--device", "CUDA0=12GiB", *RAM)
    assert code == 2 and "no model" in err


def test_rpc_devices_come_after_local_ones_on_a_tie(capsys, model, tmp_path):
    # sd-cli registers RPC servers after its built-in backends, so on equal budgets a local GPU
    # is auto-fit's main GPU, though llama.cpp lists RPC devices first.
    inv = tmp_path / "inv.yaml"
    inv.write_text("host: {ram: 64GiB}\n"
                   "devices:\n"
                   "  - {name: CUDA0, kind: gpu, backend: CUDA, memory: 24GiB}\n"
                   "  - {kind: rpc, backend: RPC, memory: 24GiB, endpoint: '10.0.0.2:50052'}\n")
    p = plan(capsys, model, "--devices", str(inv))
    assert [d["name"] for d in p["devices"]] == ["CUDA0", "RPC0"]
    assert {c for c, _ in placed(p).values()} == {"CUDA0"}


def test_ram_overcommit_is_reported(capsys, model):
    # --ram 8GiB: params budget 8 - 2 = 6 GiB < D + T + V in RAM
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "cpu", "--device", "CUDA0=12GiB", "--ram", "8GiB")
    assert p["warnings"] == ["RAM holds 7329 MiB of weights but its params budget is 6144 MiB"]


def test_row_split(capsys, model):
    # sd-cli ... --backend "diffusion=cuda0&cuda1" --split-mode row: every block's rows sliced in
    # proportion to max(free - 2 GiB, free / 8): 10 : 6 GiB of the 40 blocks' bytes.
    devs = ["--device", "CUDA0=12GiB", "--device", "CUDA1=8GiB", *RAM]
    p = plan(capsys, model, "--backend", "diffusion=cuda0&cuda1", "--split-mode", "row", *devs)
    blocks = 40 * (128 * MiB + 64)
    rows = p["splits"]["diffusion"]
    assert [(r["mode"], r["device"], r["first_block"], r["end_block"]) for r in rows] == [
        ("row", "CUDA0", 0, 40), ("row", "CUDA1", 0, 40)]
    assert rows[1]["bytes"] == blocks * 6 // 16 and rows[0]["bytes"] == blocks - blocks * 6 // 16
    assert p["flags"].endswith("--split-mode row")


def test_split_mode_per_module(capsys, model):
    # sd-cli ... --backend "diffusion=cuda0&cuda1,te=cuda0&cuda1" --split-mode diffusion=row,te=layer
    p = plan(capsys, model, "--backend", "diffusion=cuda0&cuda1,te=cuda0&cuda1",
             "--split-mode", "diffusion=row,te=layer", "--device", "CUDA0=12GiB", "--device", "CUDA1=12GiB", *RAM)
    assert p["splits"]["diffusion"][0]["mode"] == "row"
    # te: 16 t5 blocks, equal shares -> [0, 8) and [8, 16)
    assert [(r["mode"], r["first_block"], r["end_block"]) for r in p["splits"]["te"]] == [
        ("layer", 0, 8), ("layer", 8, 16)]
    assert p["flags"].endswith("--split-mode diffusion=row,te=layer")


def test_row_split_across_backends_falls_back_to_layer(capsys, model):
    # seed 002: devices of different backend registries -> layer split
    p = plan(capsys, model, "--backend", "diffusion=cuda0&vulkan0", "--split-mode", "row",
             "--device", "CUDA0=12GiB", "--device", "Vulkan0=12GiB", *RAM)
    assert {r["mode"] for r in p["splits"]["diffusion"]} == {"layer"}


def test_bad_split_mode(capsys, model):
    code, _, err = run(capsys, model, "--device", "CUDA0=12GiB", *RAM, "--split-mode", "column")
    assert code == 2 and "'column'" in err


def test_compatibility_flags(capsys, model):
    devs = ["--device", "CUDA0=12GiB", *RAM]
    # --clip-on-cpu / --vae-on-cpu prepend te=cpu / vae=cpu to --backend
    p = plan(capsys, model, "--clip-on-cpu", "--vae-on-cpu", "--backend", "cuda0", *devs)
    assert {k: v[0] for k, v in placed(p).items()} == {"diffusion": "CUDA0", "te": "cpu", "vae": "cpu"}
    # --control-net-cpu only touches the controlnet module
    p = plan(capsys, model, "--control-net-cpu", *devs)
    assert p["backend"].startswith("controlnet=cpu,")
    # seed 002: --offload-to-cpu --params-backend te=disk keeps non-TE parameters on CPU, TE on disk
    p = plan(capsys, model, "--offload-to-cpu", "--params-backend", "te=disk", *devs)
    assert p["mode"] == "manual"
    assert {k: v[1] for k, v in placed(p).items()} == {"diffusion": "cpu", "te": "disk", "vae": "cpu"}


def test_resident_component_is_named_under_a_params_default(capsys, model):
    # --params-backend all=disk,te=cuda0 with --backend cuda0: te's parameters are on its runtime
    # device; the reproduced flags must say so, or te would inherit all=disk.
    p = plan(capsys, model, "--backend", "cuda0", "--params-backend", "all=disk,te=cuda0",
             "--device", "CUDA0=12GiB", *RAM)
    assert placed(p)["te"] == ("CUDA0", "CUDA0")
    assert p["params_backend"] == "all=disk,diffusion=disk,te=CUDA0,vae=disk"


def test_the_sd_cli_line_pastes(capsys, model, tmp_path):
    # a file name bash would split, and a backend spec with '&' (a shell operator unquoted)
    odd = tmp_path / "my model.safetensors"
    os.symlink(model, odd)
    args = [str(odd), "--device", "CUDA0=12GiB", "--device", "CUDA1=8GiB", *RAM, "--backend", "diffusion=cuda0&cuda1"]
    p = plan(capsys, *args)
    code, line, _ = run(capsys, *args, "--format", "command")
    assert code == 0
    words = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line.strip()], capture_output=True, check=True)
    assert words.stdout.decode().split("\0")[:-1] == ["sd-cli", *p["argv"]]
    assert p["argv"][:2] == ["-m", str(odd)] and "diffusion=CUDA0&CUDA1" in " ".join(p["argv"])
