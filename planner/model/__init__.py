"""What a model is, independent of any engine (above gguf).

In: a `ModelFile`. Out: architecture facts per layer (`ModelFacts`: attention kind, SWA,
recurrent, MoE, MLA), the widths its graph materialises (`Shapes`), per-layer weight costs
(`CostTable`) and `fitplan inspect`'s result.
"""
