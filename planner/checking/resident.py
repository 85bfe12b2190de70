"""What an embedded validate run holds resident on this machine, checked before anything is allocated.

The runtime's devices all live in this process's memory: every device's KV cache and compute
buffers are host RAM here, as are the dequant cache and one banded product's working set
(runtime/ggml/dequant.py). Weights are read from a map of the model file: the kernel may evict
their pages, so they are not counted (issue #22: a validate that cannot fit says so in one line,
exit 1, instead of being OOM-killed).
"""
from __future__ import annotations

import resource
from dataclasses import dataclass

from planner.core.errors import InfeasiblePlacement, Shortfall
from planner.core.units import fmt_bytes
from planner.gguf.reader import ModelFile
from planner.llama.placement import HOST
from planner.memory.estimate import Estimate
from runtime.ggml import dequant

# The interpreter, numpy, gguf-py and the runtime's graphs before any buffer (measured: a validate
# of gemma3-270m -c 512 --reserve-only peaks at ~150 MiB)
BASELINE_BYTES = 200 << 20


@dataclass(frozen=True)
class Resident:
    kv_bytes: int
    compute_bytes: int
    cache_bytes: int
    working_bytes: int
    mapped_bytes: int         # the weights, mapped: evictable, not in `total`

    @property
    def total(self) -> int:
        return self.kv_bytes + self.compute_bytes + self.cache_bytes + self.working_bytes + BASELINE_BYTES


def dequantized_bytes(model: ModelFile) -> int:
    """float32 bytes of the model's block-quantized tensors: the most the dequant cache can hold."""
    return sum(t.n_elements * 4 for t in model.tensors if t.ggml_type.name not in ("F32", "F16", "BF16"))


def resident_needs(model: ModelFile, est: Estimate) -> Resident:
    """The estimate's KV and compute on every device (all are this process's memory), the cache as
    large as it may grow, and one band's working set."""
    return Resident(sum(d.context_bytes for d in est.devices), sum(d.compute_bytes for d in est.devices),
                    min(dequant.cache().capacity, dequantized_bytes(model)), dequant.working_set_bytes(),
                    sum(t.n_bytes for t in model.tensors))


def check_resident(model: ModelFile, est: Estimate, available: int | None = None,
                   address_space: int | None = None) -> Resident:
    """Raise InfeasiblePlacement (exit 1) when this machine's MemAvailable cannot hold `resident_needs`,
    or this process's address-space limit (`ulimit -v`) cannot map them beside the weights' map."""
    need = resident_needs(model, est)
    avail = dequant.mem_available() if available is None else available
    parts = (f"KV {fmt_bytes(need.kv_bytes)}, compute {fmt_bytes(need.compute_bytes)}, dequant cache "
             f"{fmt_bytes(need.cache_bytes)}, working set {fmt_bytes(need.working_bytes + BASELINE_BYTES)}")
    if avail is not None and need.total > avail:
        raise InfeasiblePlacement(
            f"this machine cannot hold what validate needs: {fmt_bytes(need.total)} resident ({parts}) "
            f"against {fmt_bytes(avail)} available (MemAvailable; the {fmt_bytes(need.mapped_bytes)} of mapped "
            f"weights are evictable, not counted)",
            (Shortfall(HOST, need.total, avail),))
    space = dequant.address_space_left() if address_space is None else address_space
    if space is not None and need.total + need.mapped_bytes > space:
        raise InfeasiblePlacement(
            f"this process's address-space limit (ulimit -v) cannot map what validate needs: "
            f"{fmt_bytes(need.total + need.mapped_bytes)} ({parts}, mapped weights "
            f"{fmt_bytes(need.mapped_bytes)}) against {fmt_bytes(space)} left",
            (Shortfall(HOST, need.total + need.mapped_bytes, space),))
    return need


def peak_rss_bytes() -> int:
    """This process's peak resident set (getrusage ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
