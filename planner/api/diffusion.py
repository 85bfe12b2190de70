"""`sd-fit` for the command line: stable-diffusion.cpp's auto-fit plan (planner/sd/fit.py)."""
from __future__ import annotations

from planner.sd.fit import SdFitRequest, sd_fit
from planner.sd.plan import SdPlan

__all__ = ["SdFitRequest", "SdPlan", "sd_fit"]
