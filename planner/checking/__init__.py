"""Checking a plan by running it (above planning).

In: a plan file or a model with llama.cpp flags and an inventory. Out: a `ValidateReport`:
what the embedded runtime (or llama.cpp itself) allocated beside the estimate, and a verdict.
"""
