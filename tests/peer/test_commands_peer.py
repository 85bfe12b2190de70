"""The printed commands against the pinned llama.cpp binaries (issue 17).

* For every case of tests/support/command_matrix.py that this machine can load (rpc-servers on
  loopback, the CPU), the llama-server line `fitplan plan` prints, parsed by bash, is run through
  `llama-fit-params --fit-print on`: model and context are the plan's to the MiB llama.cpp prints;
  compute is `estimate`'s for the same line (its default program, llama-fit-params' dry run) within
  the estimate's tolerance (tests/support/estimate_matrix.py compute_ok), while the plan's own compute
  is the estimate of that line as llama-server loads it (planner/llama/programs.py; the real loads are
  tests/peer/test_real_load_peer.py). llama-fit-params takes llama.cpp's common arguments only, so
  llama-server's own (SERVER_ONLY below, e.g. the --host/--port `fitplan serve` adds) are filtered
  out first.
* The llama-bench line of a plan with three overrides runs as exactly one pp row and one tg row,
  whose devices, tensor split and overrides are the plan's.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from planner.api import plan
from planner.cli import main
from planner.llama.commands import bench_argv
from planner.llama.flags import OverrideArg, OverrideKind
from planner.llama.placement import CPU_REPACK
from planner.llama.programs import Program
from planner.memory.estimate import estimate
from planner.registry.examples import resolve_model
from planner.running.tool_runs import fit_print
from tests.support.command_matrix import CASES, PlanCase
from tests.support.estimate_matrix import compute_ok

pytestmark = pytest.mark.peer

MIB = 2**20
# llama-server options that llama-fit-params (common arguments only) refuses, with their value count:
# tools/server's own (common/arg.cpp, LLAMA_EXAMPLE_SERVER only).
SERVER_ONLY = {"--host": 1, "--port": 1, "-a": 1, "--alias": 1, "--api-key": 1, "--api-key-file": 1,
               "--path": 1, "--api-prefix": 1, "--metrics": 0, "--slots": 0, "--no-slots": 0,
               "--props": 0, "--no-webui": 0, "-to": 1, "--timeout": 1, "--threads-http": 1}


def without_server_options(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in SERVER_ONLY:
            i += 1 + SERVER_ONLY[argv[i]]
            continue
        out.append(argv[i])
        i += 1
    return out


def bash_words(line: str) -> list[str]:
    done = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


CHECKABLE = [c for c in CASES if c.checkable]


def test_the_filter_drops_server_options_only():
    argv = ["-m", "m.gguf", "-c", "4096", "--host", "127.0.0.1", "--port", "8080", "--metrics", "-np", "1"]
    assert without_server_options(argv) == ["-m", "m.gguf", "-c", "4096", "-np", "1"]


@pytest.mark.parametrize("case", CHECKABLE, ids=[c.label for c in CHECKABLE])
def test_the_printed_server_line_is_what_llama_cpp_allocates(capsys, tmp_path, llama_tools, rpc_endpoints,
                                                              shapes_dir, case: PlanCase):
    doc_path = tmp_path / "plan.json"
    code = main([*case.argv(shapes_dir, rpc_endpoints), "-o", str(doc_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(doc_path.read_text())
    [line] = [s.strip() for s in out.splitlines() if s.strip().startswith("llama-server ")]
    words = bash_words(line)
    assert words == ["llama-server", *doc["argv"]]
    # as `fitplan serve` would run it, then filtered for llama-fit-params
    argv = without_server_options(words[1:] + ["--host", "127.0.0.1", "--port", "8080"])
    assert argv == doc["argv"] and argv[:2] == ["-m", doc["model"]["path"]]
    printed = fit_print(llama_tools, Path(argv[1]), argv[2:])
    dry = {d.name: d for d in estimate(argv[1], argv[2:]).devices}
    served = {d.name: d for d in estimate(argv[1], argv[2:], program=Program.SERVER).totals}
    for row in doc["devices"]:
        if row["name"] == CPU_REPACK:   # --fit-print leaves it out of its Host line (DESIGN.md)
            continue
        model, context, compute = printed[row["name"]]
        assert (row["model_bytes"] // MIB, row["context_bytes"] // MIB) == (model, context), (row, printed)
        assert compute_ok(dry[row["name"]].compute_bytes / MIB, compute, doc["compute_model"]), (row, printed)
        assert row["compute_bytes"] == served[row["name"]].compute_bytes, (row, served[row["name"]])


def test_the_bench_line_measures_the_plan(llama_tools, rpc_endpoints):
    # 60 MiB each: the layers split over both devices (-ts 9,9)
    devices = [f"RPC0=60MiB@{rpc_endpoints[0]}", f"RPC1=60MiB@{rpc_endpoints[1]}"]
    result = plan("example:gemma3-270m", devices, ram="4GiB", max_vram="RPC0=60MiB,RPC1=60MiB", n_ctx=1024)
    assert len([x for x in result.flags.tensor_split if x]) == 2
    extra = (OverrideArg(OverrideKind.OT, r"blk\.3\.ffn_down=CPU"),
             OverrideArg(OverrideKind.OT, r"blk\.(4|5)\.ffn_(up|gate)=CPU"))
    flags = replace(result.flags, override_args=result.flags.override_args + extra)
    overrides = [f"{o.pattern}={o.target}" for o in flags.overrides]
    assert len(overrides) == 3
    bench = bench_argv(result.model_path, flags, result.n_ctx)
    assert bench.argv is not None
    argv = list(bench.argv)
    # short runs: the printed -p/-n values replaced (a second -p would add a test row)
    argv[argv.index("-p") + 1], argv[argv.index("-n") + 1] = "8", "4"
    done = subprocess.run([str(llama_tools / "llama-bench"), *argv, "-r", "1", "-o", "json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert sorted((r["n_prompt"], r["n_gen"]) for r in rows) == [(0, 4), (8, 0)]
    for r in rows:
        assert r["devices"] == "/".join(flags.devices or ())
        assert r["tensor_buft_overrides"] == ";".join(overrides)
        assert r["n_gpu_layers"] == flags.n_gpu_layers and r["n_depth"] == result.n_ctx - 512
        # llama-bench prints each value "%.2f" up to the last non-zero one (test::get_values)
        ts = list(flags.tensor_split)
        last = max(i for i, x in enumerate(ts) if x)
        assert r["tensor_split"] == "/".join(f"{x:.2f}" for x in ts[:last + 1])


def test_two_ot_arguments_would_be_two_benchmarks(llama_tools):
    # why the overrides go into one -ot: the pinned llama-bench makes each -ot (and each ',' group)
    # a test row of its own, every row with one override
    model = resolve_model("example:gemma3-270m")
    argv = ["-m", model, "-ot", r"token_embd\.weight=CPU", "-ot", "output_norm=CPU", "-p", "8", "-n", "0",
            "-r", "1", "-o", "json"]
    done = subprocess.run([str(llama_tools / "llama-bench"), *argv], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["tensor_buft_overrides"] for r in json.loads(done.stdout)] == [r"token_embd\.weight=CPU",
                                                                            "output_norm=CPU"]
