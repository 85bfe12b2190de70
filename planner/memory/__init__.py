"""The estimate: what llama.cpp would allocate per device for given flags (above runtime.engine).

In: a `ModelContext`, `LlamaFlags`, an optional `Inventory`. Out: an `Estimate` with model,
context and compute bytes per llama.cpp memory-breakdown row; compute from the runtime's
reserve where a graph builder exists, else from the analytic model.
"""
