"""Measuring this machine (above checking).

In: an inventory and the pinned llama-bench. Out: timings of calibration placements, the fitted rates
written as the inventory's `calibrated:` block, and device memory as nvidia-smi / rocm-smi report it.
"""
