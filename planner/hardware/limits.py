"""llama.cpp's own limits on device counts, checked before an inventory is built: an inventory of a
billion devices is refused in one line instead of filling memory (issue #22)."""
from __future__ import annotations

# llama_max_devices() (src/llama.cpp:86 of the pinned build) returns 16: -ts and --fit-target hold
# at most that many values, and a model's device list is sized by it.
LLAMA_MAX_DEVICES = 16

# ggml_backend_sched_new asserts n_backends <= GGML_SCHED_MAX_BACKENDS (ggml/src/ggml-backend.cpp:764,
# :1872): llama.cpp gives the scheduler one backend per device plus the CPU, so more than 15
# devices abort the load.
GGML_SCHED_MAX_BACKENDS = 16
