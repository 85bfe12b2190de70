"""Placements llama.cpp accepts on its command line and then aborts on: `estimate` reports the abort
instead of figures (issue #22, deliverable 4; seed 003 §1, "classify the arrangement before running
anything").

- An -ot rule whose buffer type belongs to a device llama.cpp registered but the model does not use
  (left out by -dev, by -sm none, or skipped as the same card another backend lists first: a CUDA+Vulkan
  build lists the discrete card as CUDA0 and Vulkan0). common/arg.cpp takes the buffer type from every
  registered device, the weights it matches are allocated there, and the scheduler has no backend for
  that buffer: ggml-backend.cpp:941 GGML_ABORT("pre-allocated tensor (%s) in a buffer (%s) that cannot
  run the operation (%s)"). Checked with the pinned llama-fit-params on two rpc-servers:
  `--rpc A,B -dev RPC0 -ot 'blk\\.0\\.ffn_down\\.weight=RPC0[B]'` aborts there (exit 134).
- More devices than the scheduler holds: llama_context gives ggml_backend_sched_new one backend per
  model device plus the CPU, and it asserts n_backends <= GGML_SCHED_MAX_BACKENDS (ggml-backend.cpp:1872).
- A CUDA and a ROCm device in one process: ggml-cuda is built either for CUDA or for HIP (GGML_USE_HIP
  renames it ROCm), never both, so no llama.cpp binary lists both (seed 003 §3). Two processes do it: one
  endpoint per build, or one build's GPU behind an rpc-server the other build's process reaches with --rpc.
"""
from __future__ import annotations

import re

from planner.core.errors import FlagError
from planner.hardware.inventory import DeviceKind, Inventory, same_cards
from planner.hardware.limits import GGML_SCHED_MAX_BACKENDS
from planner.llama.flags import LlamaFlags
from planner.llama.placement import Device, TensorSlot
from runtime.ggml.profiles import Backend

_ABORT = "pre-allocated tensor ({tensor}) in a buffer ({buft}) that cannot run the operation (NONE)"


def check_expressible(flags: LlamaFlags, inventory: Inventory | None, devices: tuple[Device, ...],
                      slots: tuple[TensorSlot, ...]) -> None:
    """Raise FlagError with the abort llama.cpp would hit for these flags on this model and inventory."""
    if len(devices) + 1 > GGML_SCHED_MAX_BACKENDS:
        raise FlagError(f"{len(devices)} devices and the CPU are {len(devices) + 1} scheduler backends; llama.cpp "
                        f"aborts: GGML_ASSERT(n_backends <= GGML_SCHED_MAX_BACKENDS) with "
                        f"GGML_SCHED_MAX_BACKENDS = {GGML_SCHED_MAX_BACKENDS} (ggml-backend.cpp:1872); "
                        f"use at most {GGML_SCHED_MAX_BACKENDS - 1} devices (-dev)")
    _check_one_gpu_build(devices)
    check_overrides(flags, inventory, devices, slots)


def check_overrides(flags: LlamaFlags, inventory: Inventory | None, devices: tuple[Device, ...],
                    slots: tuple[TensorSlot, ...]) -> None:
    """Raise FlagError where an -ot rule sends a weight to a device the model does not use (the first
    abort above): the one check that depends on the placement flags, so a planner re-runs it per placement."""
    if flags.split_mode == "tensor":
        return   # one meta device over the members: its own rules (planner/llama/tensor_parallel.py)
    used = {name for d in devices for name in d.buft_names()}
    unused = _unused_buffer_types(flags, inventory, used)
    if not unused:
        return
    rules = [(re.compile(o.pattern), o) for o in flags.overrides]
    for slot in slots:
        name = slot.duplicate_of or slot.name
        rule = next((o for regex, o in rules if regex.search(name)), None)
        if rule is not None and rule.target in unused:
            device, why = unused[rule.target]
            raise FlagError(f"-ot {rule.pattern}={rule.target}: {device} is not one of the model's devices ({why}); "
                            f"llama.cpp still takes its buffer type, allocates {name} there and aborts at its first "
                            f"reserve: '{_ABORT.format(tensor=name, buft=rule.target)}' (ggml-backend.cpp:941). "
                            f"Seed 003 §1: only the CPU or a device of the model can hold an overridden tensor")


def _check_one_gpu_build(devices: tuple[Device, ...]) -> None:
    """Refuse a process whose local devices need both a CUDA and a HIP build of ggml-cuda."""
    cuda = [d.name for d in devices if d.backend is Backend.CUDA]
    rocm = [d.name for d in devices if d.backend is Backend.ROCM]
    if cuda and rocm:
        raise FlagError(f"{', '.join(cuda)} (CUDA) and {', '.join(rocm)} (ROCm) in one llama.cpp process: ggml-cuda "
                        f"is built for CUDA or for HIP, not both, so no llama.cpp binary lists both (seed 003 §3); "
                        f"use two endpoints: plan each build's devices on their own (--device / -dev) and serve one "
                        f"llama-server per build, or run an rpc-server of one build and reach it from the other "
                        f"with --rpc")


def _unused_buffer_types(flags: LlamaFlags, inventory: Inventory | None,
                         used: set[str]) -> dict[str, tuple[str, str]]:
    """Buffer type name -> (device, why the model does not use it), for registered devices the model's
    device list leaves out."""
    specs = [s for s in (inventory.devices if inventory else ()) if s.kind is not DeviceKind.CPU
             and not (s.kind is DeviceKind.RPC and s.endpoint and s.endpoint not in flags.rpc)]
    skipped = {same.skipped: same.used for same in same_cards(specs)}
    out: dict[str, tuple[str, str]] = {}
    for spec in specs:
        for buft in Device(spec.name, spec.backend, 0, 0, False, spec.endpoint).buft_names():
            if buft in used:
                continue
            if spec.name in skipped:
                why = f"llama.cpp skips it as the same card as {skipped[spec.name]}"
            elif flags.split_mode == "none":
                why = "-sm none uses the main GPU only"
            elif flags.devices is not None:
                why = f"-dev {','.join(flags.devices)} leaves it out"
            else:
                why = "the model's device list leaves it out"
            out[buft] = (spec.name, why)
    return out
