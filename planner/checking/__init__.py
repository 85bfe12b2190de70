"""Checking a plan (above emit).

In: a plan file or a model with llama.cpp flags and an inventory. Out: a `ValidateReport`: what the
embedded runtime (or llama.cpp itself, through tool_runs) allocated beside the estimate, and a verdict.
"""
