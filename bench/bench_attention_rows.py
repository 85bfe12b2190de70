"""What a decoded token's attention costs on this machine's host, by the shape of the KV cache (session 16's probe).

    python -m bench.bench_attention_rows [--rounds 2] [--repeats 10] [--n-gen 16] [--depth 2048] [--max-load 1.5]

The throughput model prices attention by the cache bytes a token's query heads sweep: n_head x cells x the
layer's K and V bytes a cell (llama.cpp keeps every KV head of a cell in one row). The bench writes 4-layer
random-weight llamas with the same 8 query heads 64 wide and 8, 4, 2 or 1 KV heads — the same (query head,
cell) pairs and K/V values, rows of 2, 1, 0.5 and 0.25 KiB — and runs the pinned llama-bench on the host alone
(one thread) at depth 0 and at --depth, --rounds processes round-robin. Each line gives the time the depth adds
to a token (fastest samples), the pairs and swept bytes it adds as fitplan counts them, and the time per pair
and per swept byte: if the sweep prices attention, the last column holds still while the pairs' does not.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from bench.quiet import host_round_args, host_rounds
from planner.checking.llama_bench import BenchJob, Workload, fastest_timing, placement_views
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import Inventory
from planner.llama.context import model_context
from planner.llama.placement import CPU
from planner.model.costs import cost_table
from planner.planning.throughput import NO_ATTENTION, AttentionWork, decode_attention
from tests.support.gguf_factory import add_tokenizer, llama_spec
from tests.support.tiny_models import write_random

KV_HEADS = (8, 4, 2, 1)
HOST = ("-ngl", "0")


def write_shape(path: Path, n_head_kv: int) -> Path:
    """4 layers, 8 query heads 64 wide over `n_head_kv` KV heads, Q8_0 weights (bench_throughput's attention probe
    is the one over 4)."""
    spec = llama_spec(n_layer=4, n_embd=512, n_head=8, n_head_kv=n_head_kv, n_ff=1024, n_vocab=4096,
                      attn_type=Q.Q8_0, ffn_type=Q.Q8_0, down_type=Q.Q8_0, out_type=Q.Q8_0)
    add_tokenizer(spec, 4096, n_merges=8)
    return write_random(path, spec)


def attention_work(path: str, works: tuple[Workload, ...], inventory: Inventory) -> list[AttentionWork]:
    """The attention one decoded token works through on the host under each workload, as the throughput model
    counts it (the header read once)."""
    ctx = model_context(path)
    costs = cost_table(ctx.model, ctx.facts)
    return [decode_attention(ctx.facts, costs, placement_views(ctx, list(HOST), inventory, w, []).decode)
            .get(CPU, NO_ATTENTION) for w in works]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    host_round_args(ap, rounds=2)
    ap.add_argument("--depth", type=int, default=2048)
    args = ap.parse_args()
    shallow = Workload(n_prompt=32, n_gen=args.n_gen, repeats=args.repeats, threads=1)
    deep = replace(shallow, n_depth=args.depth)
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-rows-") as tmp:
        models = {kv: str(write_shape(Path(tmp) / f"kv{kv}.gguf", kv)) for kv in KV_HEADS}
        jobs = [BenchJob(path, HOST, w) for path in models.values() for w in (shallow, deep)]
        per_round = host_rounds(jobs, args.rounds, args.max_load, args.max_wait_s,
                                f"== attention by cache shape: host alone, -t 1, tg{args.n_gen} x {args.repeats} "
                                f"repeats at depths 0 and {args.depth} in each of {args.rounds} rounds")
        inventory = detect_inventory([])
        for i, (kv, path) in enumerate(models.items()):
            t0 = 1 / fastest_timing(per_round[2 * i]).tg_tokens_s
            t1 = 1 / fastest_timing(per_round[2 * i + 1]).tg_tokens_s
            a0, a1 = attention_work(path, (shallow, deep), inventory)
            added, pairs, swept = t1 - t0, a1.pairs - a0.pairs, a1.swept - a0.swept
            print(f"  8 query heads over {kv} KV heads: +{added * 1e3:6.2f} ms a token for {pairs:,.0f} pairs, "
                  f"{swept / 2**20:5.1f} MiB swept: {added / pairs * 1e9:6.1f} ns a pair, "
                  f"{swept / added / 1e9 if added > 0 else float('nan'):5.1f} GB/s swept")


if __name__ == "__main__":
    main()
