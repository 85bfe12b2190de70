"""Benchmark: split and allocate a ~3,000-node transformer-shaped graph.

A llama-shaped decoder (flash attention, KV written with SET_ROWS, SwiGLU FFN) of 104 layers
is placed like `-ngl` with a layer split over two virtual GPUs, the last 8 layers and the
token embeddings staying in host memory (so op offload stages their weights at batch 512).
Prints the wall time of split+allocate, in ms: from scratch (`reserve`: passes, splits, the
allocator's walk, buffers) and reusing the reserved plan (`alloc`),
for a prompt-processing batch (512) and a generation batch (1). Target: < 50 ms per
split+allocate. Run: python -m bench.bench_sched
"""
from __future__ import annotations

import statistics
import time

from planner.core.units import GiB
from runtime.ggml import build as B
from runtime.ggml.backend import Backend, alloc_tensors, make_cpu, make_virtual
from runtime.ggml.graph import BufferUsage, GGMLType, Graph, Tensor
from runtime.ggml.sched import Scheduler

N_LAYER, N_CPU_LAYERS = 104, 8
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_CTX, N_VOCAB = 256, 8, 4, 32, 512, 1024, 1000
F16, F32, I32, I64 = GGMLType.F16, GGMLType.F32, GGMLType.I32, GGMLType.I64


def _weights(home: Backend, il: int) -> dict[str, Tensor]:
    shapes = {"attn_norm": [N_EMBD], "wq": [N_EMBD, N_HEAD * HEAD_DIM], "wk": [N_EMBD, N_HEAD_KV * HEAD_DIM],
              "wv": [N_EMBD, N_HEAD_KV * HEAD_DIM], "wo": [N_HEAD * HEAD_DIM, N_EMBD], "ffn_norm": [N_EMBD],
              "gate": [N_EMBD, N_FF], "up": [N_EMBD, N_FF], "down": [N_FF, N_EMBD]}
    w = {k: B.new_tensor(F32 if "norm" in k else F16, s, f"blk.{il}.{k}.weight") for k, s in shapes.items()}
    alloc_tensors(home.buffer_type, list(w.values()), BufferUsage.WEIGHTS)
    kv = [B.new_tensor(F16, [N_HEAD_KV * HEAD_DIM, N_CTX], f"cache_{c}_l{il}") for c in "kv"]
    alloc_tensors(home.buffer_type, kv)
    w["k_cache"], w["v_cache"] = kv
    return w


def _layer(graph: Graph, x: Tensor, w: dict[str, Tensor], io: dict[str, Tensor], il: int, n_tok: int) -> Tensor:
    cur = B.mul(B.rms_norm(x, 1e-5, f"norm-{il}"), w["attn_norm"], f"attn_norm-{il}")
    q = B.reshape(B.mul_mat(w["wq"], cur, f"Qcur-{il}"), [HEAD_DIM, N_HEAD, n_tok])
    k = B.reshape(B.mul_mat(w["wk"], cur, f"Kcur-{il}"), [HEAD_DIM, N_HEAD_KV, n_tok])
    v = B.reshape(B.mul_mat(w["wv"], cur, f"Vcur-{il}"), [HEAD_DIM, N_HEAD_KV, n_tok])
    q, k = B.rope(q, io["pos"], HEAD_DIM, 2, name=f"Qrope-{il}"), B.rope(k, io["pos"], HEAD_DIM, 2, name=f"Krope-{il}")
    k_store = B.set_rows(w["k_cache"], B.reshape(k, [N_HEAD_KV * HEAD_DIM, n_tok]), io["kv_idx"])
    v_store = B.set_rows(w["v_cache"], B.reshape(v, [N_HEAD_KV * HEAD_DIM, n_tok]), io["kv_idx"])
    row = w["k_cache"].nb[1]
    kview = B.view(w["k_cache"], [HEAD_DIM, N_CTX, N_HEAD_KV], [2, row, 2 * HEAD_DIM], name=f"k-{il}")
    vview = B.view(w["v_cache"], [HEAD_DIM, N_CTX, N_HEAD_KV], [2, row, 2 * HEAD_DIM], name=f"v-{il}")
    attn = B.flash_attn_ext(B.permute(q, [0, 2, 1, 3]), kview, vview, io["mask"], HEAD_DIM ** -0.5,
                            name=f"fattn-{il}")
    graph.expand(k_store)  # llama.cpp adds the KV writes first so they are not reordered
    graph.expand(v_store)
    o = B.mul_mat(w["wo"], B.reshape(attn, [N_HEAD * HEAD_DIM, n_tok]), f"attn_out-{il}")
    ffn_inp = B.add(o, x, f"ffn_inp-{il}")
    cur = B.mul(B.rms_norm(ffn_inp, 1e-5, f"ffn_norm-{il}"), w["ffn_norm"], f"ffn_normed-{il}")
    gate = B.silu(B.mul_mat(w["gate"], cur, f"ffn_gate-{il}"), f"ffn_silu-{il}")
    up = B.mul_mat(w["up"], cur, f"ffn_up-{il}")
    down = B.mul_mat(w["down"], B.mul(gate, up, f"ffn_gu-{il}"), f"ffn_down-{il}")
    return B.add(down, ffn_inp, f"l_out-{il}")


def build(n_tok: int, weights: list[dict[str, Tensor]], tok_embd: Tensor, output: Tensor) -> Graph:
    graph = Graph()
    io = {"pos": B.new_input(I32, [n_tok], "inp_pos"),
          "kv_idx": B.new_input(I64, [n_tok], "kv_idxs"),
          "mask": B.new_input(F16, [N_CTX, n_tok], "kq_mask")}
    x = B.get_rows(tok_embd, B.new_input(I32, [n_tok], "inp_tokens"), "inp_embd")
    for il, w in enumerate(weights):
        x = _layer(graph, x, w, io, il, n_tok)
    graph.expand(B.mul_mat(output, B.rms_norm(x, 1e-5, "result_norm"), "result_output"))
    return graph


def main() -> None:
    gpus = [make_virtual("GPU0", 64 * GiB), make_virtual("GPU1", 64 * GiB)]
    cpu = make_cpu(capacity=64 * GiB)
    per_gpu = (N_LAYER - N_CPU_LAYERS) // 2
    homes = [gpus[0]] * per_gpu + [gpus[1]] * per_gpu + [cpu] * N_CPU_LAYERS
    weights = [_weights(home, il) for il, home in enumerate(homes)]
    tok_embd = B.new_tensor(F16, [N_EMBD, N_VOCAB], "token_embd.weight")
    output = B.new_tensor(F16, [N_EMBD, N_VOCAB], "output.weight")
    alloc_tensors(cpu.buffer_type, [tok_embd, output], BufferUsage.WEIGHTS)
    for n_tok in (512, 1):
        sched = Scheduler([*gpus, cpu])
        t0 = time.perf_counter()
        graph = build(n_tok, weights, tok_embd, output)
        t_build = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        sizes = sched.reserve(graph)
        t_reserve = (time.perf_counter() - t0) * 1e3
        times, full = [], []
        for _ in range(7):
            t0 = time.perf_counter()
            sched.alloc(graph)
            times.append((time.perf_counter() - t0) * 1e3)
            sched.reset()
            t0 = time.perf_counter()
            sched.reserve(graph)
            full.append((time.perf_counter() - t0) * 1e3)
        print(f"batch {n_tok:3d}: nodes = {len(graph.nodes)}, leafs = {len(graph.leafs)}, "
              f"splits = {sched.n_splits}, reallocs after reserve = {sched.n_reallocs}")
        print(f"  build {t_build:.1f} ms")
        print(f"  split+allocate, fresh plan (reserve): first {t_reserve:.1f} ms, "
              f"median {statistics.median(full):.1f} ms, min {min(full):.1f} ms  (target < 50 ms)")
        print(f"  split+allocate, reserved plan (alloc): median {statistics.median(times):.1f} ms, "
              f"min {min(times):.1f} ms  (target < 50 ms)")
        print("  compute buffers: " + ", ".join(f"{k} {v} B" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
