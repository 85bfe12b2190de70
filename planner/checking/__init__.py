"""Checking a plan (above emit).

In: a plan file or a model with llama.cpp flags and an inventory. Out: a `ValidateReport`: what the
embedded runtime allocated beside the estimate, and a verdict. It runs no program: llama.cpp's tool drivers
and `validate --engine llama.cpp` are planner.running's (tool_runs, validate_llama).
"""
