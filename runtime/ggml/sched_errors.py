"""Runtime errors, rooted in planner.core.errors so the CLI's single catch covers them.

`BufferAllocationError` is an `InfeasiblePlacement` (exit 1): it carries the device and the
shortfall in bytes, which is exactly the fact a placement plan needs. `SchedulerError`
replaces ggml's GGML_ASSERT/GGML_ABORT in the scheduler: a backend list or graph the
scheduler cannot work with (exit 2, bad input).
"""
from __future__ import annotations

from planner.core.errors import FitplanError, InfeasiblePlacement, Shortfall
from planner.core.units import fmt_bytes


class BufferAllocationError(InfeasiblePlacement):
    """A buffer does not fit in what its device has left."""

    def __init__(self, device: str, buffer_type: str, size: int, used: int, capacity: int) -> None:
        self.device = device
        self.size = size
        self.shortfall_bytes = used + size - capacity
        message = (
            f"{device}: cannot allocate a {buffer_type} buffer of {fmt_bytes(size)}: "
            f"{fmt_bytes(capacity - used)} free of {fmt_bytes(capacity)}, "
            f"short by {fmt_bytes(self.shortfall_bytes)} ({self.shortfall_bytes} bytes)"
        )
        super().__init__(message, shortfalls=(Shortfall(device, used + size, capacity),))


class SchedulerError(FitplanError):
    """The scheduler was given a backend list or a graph it cannot place (ggml would abort)."""
