"""planner.running.tool_runs.parse_model_loads: one log, one dict of buffers per model load (target, drafter)."""
from __future__ import annotations

from planner.core.units import MiB
from planner.running.tool_runs import parse_model_loads

LOG = """\
0.00.059 I llama_model_loader: loaded meta data with 33 key-value pairs and 236 tensors from target.gguf
0.00.514 I load_tensors:          CPU model buffer size =   222.51 MiB
0.00.514 I load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
0.00.541 I llama_kv_cache:        CPU KV buffer size =    12.00 MiB
0.00.550 I llama_kv_cache:        CPU KV buffer size =    15.00 MiB
0.00.573 I sched_reserve:        CPU compute buffer size =    22.77 MiB
0.00.573 I sched_reserve: graph: nodes = 727, splits = 1, input objects = 4, input tensors = 9
0.00.604 I common_speculative_init_result: loading draft model 'drafter.gguf'
0.00.664 I llama_model_loader: loaded meta data with 30 key-value pairs and 68 tensors from drafter.gguf
0.01.157 I load_tensors: RPC0[127.0.0.1:5] model buffer size =    75.33 MiB
0.01.185 I llama_kv_cache: RPC0[127.0.0.1:5] KV buffer size =    80.00 MiB
0.01.229 I sched_reserve: RPC0[127.0.0.1:5] compute buffer size =    13.01 MiB
0.01.229 I sched_reserve: graph: nodes = 207, splits = 2, input objects = 4, input tensors = 6
0.02.000 D ~llama_context:        CPU compute buffer size is  13.5117 MiB, matches expectation of  13.5117 MiB
"""


def test_each_load_keeps_its_own_buffers():
    target, drafter = parse_model_loads(LOG)
    assert target == {("CPU", "model"): round(222.51 * MiB), ("CPU_REPACK", "model"): round(12.66 * MiB),
                      ("CPU", "context"): 27 * MiB, ("CPU", "compute"): round(22.77 * MiB)}
    rpc = "RPC0[127.0.0.1:5]"
    assert drafter == {(rpc, "model"): round(75.33 * MiB), (rpc, "context"): 80 * MiB,
                       (rpc, "compute"): round(13.01 * MiB)}


def test_a_log_without_a_load_line_is_one_load():
    assert parse_model_loads("sched_reserve:        CPU compute buffer size =     1.00 MiB\n") == [
        {("CPU", "compute"): MiB}]


# mtp: lines in the form the pinned llama-server logs --spec-type draft-mtp (-v, -fit off; a small qwen35 file,
# the first MTP reserve made smaller so that the test tells the two apart)
MTP_LOG = """\
0.00.006 I llama_model_loader: loaded meta data with 26 key-value pairs and 71 tensors from qwen35-mtp.gguf
0.00.011 I load_tensors:          CPU model buffer size =     1.55 MiB
0.00.014 I llama_kv_cache:        CPU KV buffer size =     2.00 MiB
0.00.015 I llama_memory_recurrent:        CPU RS buffer size =     0.22 MiB
0.00.023 I sched_reserve:        CPU compute buffer size =     6.77 MiB
0.00.023 I sched_reserve: graph: nodes = 268, splits = 1, input objects = 4, input tensors = 7
0.00.031 I common_speculative_init_result: creating MTP draft context against the target model 'qwen35-mtp.gguf'
0.00.031 I llama_kv_cache:        CPU KV buffer size =     2.00 MiB
0.00.040 I sched_reserve:        CPU compute buffer size =     6.40 MiB
0.00.040 I sched_reserve: graph: nodes = 50, splits = 1, input objects = 4, input tensors = 7
0.00.049 I sched_reserve:        CPU compute buffer size =     6.52 MiB
0.00.049 I sched_reserve: graph: nodes = 56, splits = 1, input objects = 5, input tensors = 7
"""


def test_the_mtp_context_is_a_load_of_its_own():
    """No model load opens draft-mtp's context: its cache and its two reserves (the second, after the draft's
    samplers are set, logs the grown buffer) follow the 'creating MTP draft context' line."""
    target, mtp = parse_model_loads(MTP_LOG)
    assert target == {("CPU", "model"): round(1.55 * MiB), ("CPU", "context"): round(2.22 * MiB),
                      ("CPU", "compute"): round(6.77 * MiB)}
    assert mtp == {("CPU", "context"): 2 * MiB, ("CPU", "compute"): round(6.52 * MiB)}
