"""The model file as bytes (above runtime.ggml and system).

In: a GGUF path (split models by their first shard) or a URL. Out: `ModelFile`, a memory-mapped,
bounds-checked header (metadata, tensor infos with their data offsets), and read-only views of tensor
data for the runtime.
"""
