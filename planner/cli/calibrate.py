"""`fitplan calibrate [--rpc host:port,...] [-o INVENTORY.yaml]`: this machine's rates measured with the
pinned llama-bench, written as an inventory whose `calibrated:` block the throughput model prefers."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
import yaml

from planner import api
from planner.cli.options import Format, OutputFormat, RpcOpt


class Estimate(str, Enum):
    """llama_bench.ESTIMATES's names, for the option's choices."""

    FASTEST = "fastest"
    MEDIAN = "median"
    UNSTOLEN = "unstolen"


def calibrate_cmd(
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the inventory YAML here "
                                                "(default: print it)")] = None,
    rpc: RpcOpt = None,
    model: Annotated[str, typer.Option("--model", help="the model llama-bench runs")] = "example:gemma3-270m",
    probe: Annotated[str | None, typer.Option("--attention-probe", help="a second model, of other attention "
                                              "shapes than --model's (Gemma 3's: 4 query heads over one 256-wide "
                                              "KV head), run on each device at both depths too: its depth runs are "
                                              "further observations of the rate attention sweeps cache rows")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="llama-bench -r: many short "
                                          "samples, of which the fastest counts")] = 10,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="llama-bench processes a placement, run "
                                        "round-robin over the placements")] = 1,
    estimate: Annotated[Estimate, typer.Option("--estimate", help="a placement's figure: the fastest of all its "
                                               "samples (a sample on shared cores is only ever slowed by other "
                                               "work), the median of its rounds' medians, or that median of "
                                               "medians each divided by the share of CPU time the hypervisor left "
                                               "its process (unstolen)")] = Estimate.FASTEST,
    n_prompt: Annotated[int, typer.Option("--prompt-tokens", min=1, help="llama-bench -p")] = 128,
    n_gen: Annotated[int, typer.Option("--gen-tokens", min=1, help="llama-bench -n")] = 16,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="llama-bench -t")] = None,
    fmt: Format = OutputFormat.TABLE,
) -> None:
    """Measure this machine's weight-streaming bandwidth, matrix throughput and per-split hand-off
    latency (of the host and each --rpc endpoint) with llama-bench; write them as an inventory."""
    if output is not None:
        api.check_output_path(output)    # before the minutes llama-bench takes
    workload = api.Workload(n_prompt, n_gen, 0, repeats, threads)
    result = api.calibrate(api.CalibrateRequest(api.rpc_endpoints(rpc), model, workload, probe=probe, rounds=rounds,
                                                estimate=estimate.value))
    text = yaml.safe_dump(result.document(), sort_keys=False, allow_unicode=True)
    if output is None:
        typer.echo(text, nl=False)
        return
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    api.write_atomic(output, write)
    typer.echo(api.render(result, fmt), nl=fmt != "table")
    if fmt == "table":
        typer.echo(f"wrote {output}")
