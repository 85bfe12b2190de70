"""Reading a llama-server log whose target applies LoRA adapters (planner/running/tool_runs.py).

With applied adapters llama-server reserves twice: at context creation without them, then at
warmup with them in the graph (llama-context.cpp set_adapters_lora marks the scheduler, the warmup
decode's sched_reserve builds a new one). The load's model and KV buffers are logged once, before
the first reserve; the compute buffers that stay are the last reserve's. The lines below are
llama-server's own (-v, -fit off and -fit on, the pinned build), trimmed to the ones the reader reads.
"""
from __future__ import annotations

from planner.core.units import MiB
from planner.running.tool_runs import parse_buffers, parse_log, parse_model_loads

LOAD = """\
llama_model_loader: loaded meta data with 15 key-value pairs and 39 tensors from /tmp/target.gguf (version GGUF V3)
load_tensors:   CPU_Mapped model buffer size =     2.72 MiB
load_tensors:   CPU_REPACK model buffer size =     0.35 MiB
"""
ADAPTER = """\
llama_adapter_lora_init: loading lora adapter from '/tmp/wide.gguf' ...
llama_adapter_lora_init_impl: CPU_Mapped LoRA buffer size =     0.66 MiB
llama_adapter_lora_init_impl:        CPU LoRA buffer size =     0.34 MiB
"""
CONTEXT = """\
llama_kv_cache:        CPU KV buffer size =     4.00 MiB
sched_reserve: reserving ...
sched_reserve:        CPU compute buffer size =     6.51 MiB
sched_reserve: graph: nodes = 130, splits = 1, input objects = 4, input tensors = 6
"""
WARMUP = """\
common_init_from_params: warming up the model with an empty run - please wait ... (--no-warmup to disable)
sched_reserve: reserving ...
sched_reserve:        CPU compute buffer size =     7.01 MiB
sched_reserve: graph: nodes = 242, splits = 1, input objects = 4, input tensors = 6
"""
WARMUP_PLAIN = "common_init_from_params: warming up the model with an empty run - please wait ...\n"
DRY_RUN = """\
llama_model_loader: loaded meta data with 15 key-value pairs and 39 tensors from /tmp/target.gguf (version GGUF V3)
load_tensors:          CPU model buffer size =     0.00 MiB
load_tensors:   CPU_REPACK model buffer size =     0.00 MiB
llama_kv_cache:        CPU KV buffer size =     0.00 MiB
sched_reserve:        CPU compute buffer size =     6.51 MiB
sched_reserve: graph: nodes = 130, splits = 1, input objects = 4, input tensors = 6
"""
DRAFTER = """\
llama_model_loader: loaded meta data with 15 key-value pairs and 21 tensors from /tmp/draft.gguf (version GGUF V3)
load_tensors:   CPU_Mapped model buffer size =     1.10 MiB
llama_kv_cache:        CPU KV buffer size =     2.00 MiB
sched_reserve:        CPU compute buffer size =     3.25 MiB
sched_reserve: graph: nodes = 66, splits = 1, input objects = 4, input tensors = 6
"""


def _mib(x: float) -> int:
    return round(x * MiB)


TARGET = {("CPU_Mapped", "model"): _mib(2.72), ("CPU_REPACK", "model"): _mib(0.35), ("CPU", "context"): _mib(4.0)}


def test_a_load_reserved_again_keeps_its_buffers_and_the_last_compute():
    text = LOAD + ADAPTER + CONTEXT + WARMUP
    assert parse_buffers(text) == {**TARGET, ("CPU", "compute"): _mib(7.01)}
    assert parse_model_loads(text) == [{**TARGET, ("CPU", "compute"): _mib(7.01)}]
    assert parse_log(text).n_nodes_pp == 242


def test_fit_on_dry_run_then_a_load_reserved_again():
    text = DRY_RUN + LOAD + ADAPTER + CONTEXT + WARMUP
    assert parse_buffers(text) == {**TARGET, ("CPU", "compute"): _mib(7.01)}
    dry, real = parse_model_loads(text)
    assert dry[("CPU", "compute")] == _mib(6.51)
    assert real == {**TARGET, ("CPU", "compute"): _mib(7.01)}


def test_a_drafter_after_a_target_with_adapters():
    """Each model's compute is its own last reserve: the target's re-reserve is not summed in."""
    text = LOAD + ADAPTER + CONTEXT + WARMUP + DRAFTER
    target, drafter = parse_model_loads(text)
    assert target == {**TARGET, ("CPU", "compute"): _mib(7.01)}
    assert drafter == {("CPU_Mapped", "model"): _mib(1.1), ("CPU", "context"): _mib(2.0),
                       ("CPU", "compute"): _mib(3.25)}


def test_logs_without_adapters_read_as_before():
    plain = LOAD + CONTEXT + WARMUP_PLAIN
    assert parse_buffers(plain) == {**TARGET, ("CPU", "compute"): _mib(6.51)}
    assert parse_buffers(DRY_RUN + plain) == parse_buffers(plain)   # the dry run is dropped
    assert parse_model_loads(DRY_RUN + plain)[1] == parse_buffers(plain)
    assert parse_buffers(LOAD) == {("CPU_Mapped", "model"): _mib(2.72), ("CPU_REPACK", "model"): _mib(0.35)}
