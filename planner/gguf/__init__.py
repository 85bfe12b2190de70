"""The model file as bytes (above runtime.ggml and core).

In: a GGUF path (split models by their first shard) or `example:NAME`. Out: `ModelFile`, a
memory-mapped, bounds-checked header (metadata, tensor infos with their data offsets), the
bundled examples' paths, and read-only views of tensor data for the runtime.
"""
