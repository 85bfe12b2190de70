"""Issue #22 deliverable 4: placements llama.cpp accepts and then aborts on are reported by `estimate`
(and refused by `plan`'s flags) as the abort llama.cpp would hit, not as figures. The peer tests run
the same flags through the pinned llama-fit-params on rpc-servers and see it abort."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from planner.cli import main
from planner.hardware.limits import GGML_SCHED_MAX_BACKENDS
from planner.registry.examples import resolve_model

A, B = "127.0.0.1:50001", "127.0.0.1:50002"
RPC = ["--device", f"RPC0=8GiB@{A}", "--device", f"RPC1=8GiB@{B}"]
DOWN0 = rf"blk\.0\.ffn_down\.weight=RPC0[{B}]"     # ggml-rpc names every server's buffer type RPC0[host:port]


def estimate(capsys, *argv: str) -> tuple[int, str]:
    code = main(["estimate", "example:gemma3-270m", *argv])
    out = capsys.readouterr()
    return code, out.err


def test_an_override_onto_a_device_dev_leaves_out_is_the_abort(capsys):
    code, err = estimate(capsys, *RPC, "--", "--rpc", f"{A},{B}", "-dev", "RPC0", "-c", "512", "-ot", DOWN0)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "RPC1 is not one of the model's devices (-dev RPC0 leaves it out)" in err
    assert (f"'pre-allocated tensor (blk.0.ffn_down.weight) in a buffer (RPC0[{B}]) that cannot run the "
            "operation (NONE)' (ggml-backend.cpp:941)") in err
    # the same override with both devices in the model is expressible
    code, err = estimate(capsys, *RPC, "--", "--rpc", f"{A},{B}", "-c", "512", "-ot", DOWN0)
    assert code == 0, err


def test_seed_003_vulkan_twin_of_a_cuda_card_cannot_take_an_override(capsys):
    """A CUDA+Vulkan build lists the discrete card as CUDA0 and Vulkan0 (seed 003 §1, §3); llama.cpp
    keeps CUDA0 and skips Vulkan0, so -ot ...=Vulkan0 puts weights in a buffer no backend runs."""
    cards = ["--device", "CUDA0=rtx3090,id=GPU-1", "--device", "Vulkan0=rtx3090,id=GPU-1"]
    code, err = estimate(capsys, *cards, "--", "-c", "512", "-ot", r"blk\.0\.ffn_down=Vulkan0")
    assert code == 2
    assert "Vulkan0 is not one of the model's devices (llama.cpp skips it as the same card as CUDA0)" in err
    assert "in a buffer (Vulkan0) that cannot run the operation (NONE)" in err
    code, err = estimate(capsys, *cards, "--", "-c", "512", "-ot", r"blk\.0\.ffn_down=CPU")
    assert code == 0, err


def test_more_devices_than_the_scheduler_holds_is_the_assert(capsys):
    endpoints = [f"127.0.0.1:{50100 + i}" for i in range(GGML_SCHED_MAX_BACKENDS)]
    devices = [a for i, e in enumerate(endpoints) for a in ("--device", f"RPC{i}=1GiB@{e}")]
    code, err = estimate(capsys, *devices, "--", "--rpc", ",".join(endpoints), "-c", "512")
    assert code == 2 and "GGML_ASSERT(n_backends <= GGML_SCHED_MAX_BACKENDS)" in err
    assert "(ggml-backend.cpp:1872)" in err
    code, err = estimate(capsys, *devices[:-2], "--", "--rpc", ",".join(endpoints[:-1]), "-c", "512")
    assert code == 0, err


# ----------------------------------------------------------------------------- the pinned build agrees


def _fit_params(llama_tools: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    model = str(resolve_model("example:gemma3-270m"))
    return subprocess.run([str(llama_tools / "llama-fit-params"), "-m", model, "-c", "512", *argv],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.peer
def test_llama_fit_params_aborts_on_an_override_onto_a_left_out_device(llama_tools, rpc_pair):
    a, b = rpc_pair
    run = _fit_params(llama_tools, "--rpc", f"{a},{b}", "-dev", "RPC0", "-ot", rf"blk\.0\.ffn_down\.weight=RPC0[{b}]")
    assert run.returncode != 0
    assert (f"pre-allocated tensor (blk.0.ffn_down.weight) in a buffer (RPC0[{b}]) that cannot run the operation "
            "(NONE)") in run.stdout + run.stderr
    run = _fit_params(llama_tools, "--rpc", f"{a},{b}", "-ot", rf"blk\.0\.ffn_down\.weight=RPC0[{b}]")
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.peer
def test_llama_fit_params_asserts_past_the_scheduler_backends(llama_tools):
    from planner.system.llama_tools import rpc_servers

    with rpc_servers(GGML_SCHED_MAX_BACKENDS, llama_tools) as endpoints:
        run = _fit_params(llama_tools, "--rpc", ",".join(endpoints))
        assert run.returncode != 0
        assert "GGML_ASSERT(n_backends <= GGML_SCHED_MAX_BACKENDS) failed" in run.stdout + run.stderr
        run = _fit_params(llama_tools, "--rpc", ",".join(endpoints[:-1]))
        assert run.returncode == 0, run.stderr[-2000:]
