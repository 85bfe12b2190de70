"""fitplan runtime: an embedded re-implementation of ggml's backend scheduler, and models on it.

Two layers: `runtime.ggml` (graph, backends and buffers, the five passes, splits, the graph
allocator, the scheduler, kernels), which imports nothing of the planner but `planner.core`;
and `runtime.engine` (hparams, graph builders, KV cache, the model runner, the reserve the
estimate uses), which may import the planner's lower layers (core, gguf, model, hardware, llama).
"""
