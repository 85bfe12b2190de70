"""fitplan runtime: an embedded re-implementation of ggml's backend scheduler."""
