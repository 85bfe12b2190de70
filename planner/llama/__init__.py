"""llama.cpp's rules at the pinned build (above model and hardware).

In: llama.cpp flags, `ModelFacts`, an `Inventory`. Out: parsed `LlamaFlags`, the devices in
llama.cpp's order, the placement of every weight (layer ranges, -ot overrides, host buffer
rows), context parameters and KV cache sizes, and `ModelContext`, a model read once; `LlamaSettings`
(settings.py) holds all of it for one set of flags, resolved once.
"""
