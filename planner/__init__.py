"""fitplan: placement planner for ggml engines."""
