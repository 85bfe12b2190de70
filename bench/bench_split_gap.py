"""Where a split over rpc-servers loses time (issue 21): paired rounds of llama-bench on one loopback
rpc-server, a split over two, and the output layer alone on the second.

    python -m bench.bench_split_gap [--rounds 5] [--gen-tokens 64] [--repeats 3] [--max-load 1.5]

Each round runs every variant once, one after another, so that the machine's drift over minutes falls
on all of them; a variant's figure is the median over the rounds of its time per token less the
first variant's in the same round (paired). The variants, listed before any measurement:
- one rpc-server with every layer and the output;
- a split over two (`-ts 1,1`): one boundary between two devices, and each device gets its own copies
  of the graph inputs (positions, masks, KV row indices);
- every layer on the first, the output layer alone on the second (`-ts n_layer,1`, as calibrate runs
  it): one boundary between two devices, one graph input copied into the second;
- the same two with pipeline parallelism off (a no-op `-ot` rule: llama.cpp turns it off under any
  tensor override), beside the one-server control with the same rule.
What it showed (README, "Speed figures from this machine"): the boundary between two rpc-servers costs
milliseconds a token, whatever the graph inputs. Prints figures; asserts nothing. The rpc-servers it
starts are stopped by their own handles.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.quiet import NotQuiet, load_line, wait_for_quiet
from planner.checking.llama_bench import BenchJob, Workload, run_rounds
from planner.core.llama_tools import ensure_tools, rpc_servers
from planner.gguf.examples import resolve_model
from planner.llama.context import model_context

MODEL = "example:gemma3-270m"
NO_OP_OT = ("-ot", "no_tensor_has_this_name=CPU")   # overrides nothing, but turns pipeline parallelism off
N_PROMPT = 32   # llama-bench runs a prompt test too (planner/checking/llama_bench.py reads both); kept short


def variants(n_layer: int) -> list[tuple[str, tuple[str, ...]]]:
    """(name, llama.cpp flags): device and split lists with ',' as llama.cpp takes them."""
    return [
        ("one rpc-server", ("-dev", "RPC0")),
        ("split over two, -ts 1,1", ("-dev", "RPC0,RPC1", "-ts", "1,1")),
        ("output alone on the second", ("-dev", "RPC0,RPC1", "-ts", f"{n_layer},1")),
        ("one rpc-server, no pipeline", ("-dev", "RPC0", *NO_OP_OT)),
        ("split over two, no pipeline", ("-dev", "RPC0,RPC1", "-ts", "1,1", *NO_OP_OT)),
        ("output alone on the second, no pipeline", ("-dev", "RPC0,RPC1", "-ts", f"{n_layer},1", *NO_OP_OT)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=64, help="llama-bench -n")
    ap.add_argument("--repeats", type=int, default=3, help="llama-bench -r")
    ap.add_argument("--max-load", type=float, default=1.5, help="measure only below this 1-minute load average")
    ap.add_argument("--max-wait-s", type=float, default=1800)
    args = ap.parse_args(argv)
    bin_dir = ensure_tools()
    model = str(resolve_model(MODEL))
    listed = variants(model_context(model).facts.n_layer)
    work = Workload(N_PROMPT, args.gen_tokens, 0, args.repeats, threads=1)
    jobs = [BenchJob(model, flags, work) for _name, flags in listed]

    def on_round(k: int) -> None:
        wait_for_quiet(args.max_load, time.monotonic() + args.max_wait_s)
        print(f"  round {k} of {args.rounds} (load {load_line()})", flush=True)

    print(f"load average at start: {load_line()}")
    try:
        with rpc_servers(2, bin_dir, args=["-t", "1"]) as endpoints:
            per_round = run_rounds(bin_dir, jobs, endpoints, args.rounds, on_round)
    except NotQuiet as e:
        print(e, file=sys.stderr)
        return 1
    seconds = {name: [t.tg_s_per_token for t in timings] for (name, _), timings in zip(listed, per_round, strict=True)}
    for controls, rows in ((listed[0][0], listed[:3]), (listed[3][0], listed[3:])):
        base = seconds[controls]
        for name, _ in rows:
            extra = statistics.median(1e3 * (t - b) for t, b in zip(seconds[name], base, strict=True))
            print(f"{name:<42} median {1.0 / statistics.median(seconds[name]):6.1f} tokens/s, "
                  f"{extra:+6.2f} ms a token against '{controls}' (paired over {args.rounds} rounds)")
    print(f"load average at end: {load_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
