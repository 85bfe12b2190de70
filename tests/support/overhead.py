"""The overhead a plan counts on a device beside llama.cpp's breakdown (planner/llama/overhead.py), for tests that
give a device a small budget: a budget of `room + overhead` leaves the plan `room` for its rows, as the budget of
`room` did before the overhead was counted."""
from __future__ import annotations

from planner.core.units import MiB
from planner.llama.overhead import FIGURES, ProcessKind
from runtime.ggml.profiles import Backend

CUDA_MIB = FIGURES[Backend.CUDA, ProcessKind.LLAMA][0] // MiB           # a CUDA device of the llama.cpp process
CUDA_RPC_MIB = FIGURES[Backend.CUDA, ProcessKind.RPC_SERVER][0] // MiB  # an rpc-server on CUDA
VULKAN_MIB = FIGURES[Backend.VULKAN, ProcessKind.LLAMA][0] // MiB


def cuda(room_mib: int) -> str:
    """A CUDA size (card memory or budget) that leaves `room_mib` beside the overhead."""
    return f"{room_mib + CUDA_MIB}MiB"
