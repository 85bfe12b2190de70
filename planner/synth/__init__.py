"""Synthetic model files: GGUF and safetensors headers laid out as the real ones are, for tests,
benchmarks, notebooks and planning hardware or models one does not have.

- gguf_factory: `ModelSpec` and the per-architecture layouts (`llama_spec`, `qwen3moe_spec`, ...),
  written as sparse GGUFs (real header, data a hole)
- shapes: published models' dimensions (`SHAPES`, `write_shape`), sparse
- tiny_models: tiny GGUFs with real random weights, for runs of the runtime
- lora_factory, mmproj_factory, draft_models, qwen3next_factory, glm4moe_factory: adapters, projectors,
  drafters, and the qwen3next and glm4moe layouts
- gguf_fields: a GGUF header as editable fields (for hostile-input tests)
- safetensors_factory: stable-diffusion checkpoints as sparse safetensors files

Nothing in planner/ or runtime/ imports this package (import-linter checks it); it imports only
gguf, numpy, planner.core (atomic writes) and planner.gguf.
"""
