"""A model on the scheduler: llama.cpp's graphs built from a GGUF (above llama).

In: a `LlamaSettings` (flags resolved once: placement, cparams, cache types, KV cells). Out: a
`ModelRunner` that loads weights, allocates the KV cache, reserves (the estimate's compute
figures) and runs prompt and generation steps, with what each buffer measured.
"""
