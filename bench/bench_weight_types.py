"""How fast this machine's host decodes each weight type, byte for byte (session 14's probe, kept).

    python -m bench.bench_weight_types [--rounds 3] [--repeats 10] [--n-gen 16] [--max-load 1.5]

The throughput model reads a device's weights at one calibrated bandwidth, whatever their type. On a GPU
decode streams memory and the type hardly matters; on a CPU thread it is the dot products that take the
time, and their cost per byte depends on the type (a Q5_0 block unpacks a fifth bit, a Q8_0 block does
not). The bench writes one dense llama with random weights (gguf-py) per type — the same shape, every
matrix in that type — and runs the pinned llama-bench decode on the host alone, one thread, --rounds
processes round-robin, with the bundled Gemma 3 (mostly Q8_0 and Q5_0) beside them. Each line gives the
bytes one token reads (fitplan's own cost table) and those bytes times the fastest sample's tokens/s.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from bench.quiet import host_round_args, host_rounds
from planner.checking.llama_bench import BenchJob, Workload, fastest_timing, placement_views
from planner.gguf.examples import resolve_model
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import Inventory
from planner.llama.context import model_context
from planner.llama.placement import CPU
from planner.model.costs import cost_table
from planner.planning.throughput import decode_bytes
from tests.support.gguf_factory import add_tokenizer, llama_spec
from tests.support.tiny_models import write_random

# the types gguf-py can write (it quantizes no k-quant)
TYPES = (Q.F16, Q.Q8_0, Q.Q5_0, Q.Q4_0)
GEMMA = "example:gemma3-270m"
HOST = ("-ngl", "0")


def write_dense(directory: Path, qtype: Q) -> Path:
    """A 4-layer llama, n_embd 2048, n_ff 5632, every matrix (embeddings too) in `qtype`: ~100-360 MiB."""
    spec = llama_spec(n_layer=4, n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_vocab=4096, attn_type=qtype,
                      v_type=qtype, ffn_type=qtype, down_type=qtype, embd_type=qtype, out_type=qtype)
    add_tokenizer(spec, 4096, n_merges=8)
    return write_random(directory / f"dense-{qtype.name.lower()}.gguf", spec)


def bytes_per_token(path: str, work: Workload, inventory: Inventory) -> int:
    """The weight bytes one decoded token reads on the host alone, as the throughput model counts them."""
    ctx = model_context(path)
    views = placement_views(ctx, list(HOST), inventory, work, [])
    weights, _ = decode_bytes(ctx.facts, cost_table(ctx.model, ctx.facts), views.decode)
    return weights[CPU]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    host_round_args(ap, rounds=3)
    args = ap.parse_args()
    # llama-bench's JSON is read for a prompt and a decode test: a short prompt, not reported
    work = Workload(n_prompt=32, n_gen=args.n_gen, repeats=args.repeats, threads=1)
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-types-") as tmp:
        models = {q.name: str(write_dense(Path(tmp), q)) for q in TYPES}
        models["Gemma 3 270M Q4_K_M"] = resolve_model(GEMMA)
        per_round = host_rounds([BenchJob(m, HOST, work) for m in models.values()], args.rounds, args.max_load,
                                args.max_wait_s, f"== decode rate by weight type: host alone, -t 1, tg{args.n_gen} x "
                                f"{args.repeats} repeats in each of {args.rounds} rounds")
        inventory = detect_inventory([])    # asked once (llama-cli lists the devices), not once a model
        for (name, path), timings in zip(models.items(), per_round, strict=True):
            n = bytes_per_token(path, work, inventory)
            tg = fastest_timing(timings).tg_tokens_s
            print(f"  {name:<20} {n / 2**20:7.1f} MiB a token  {tg:7.2f} tokens/s  {n * tg / 1e9:6.2f} GB/s")


if __name__ == "__main__":
    main()
