"""Running a plan on llama-server (above measuring and checking).

In: a plan file or a plan set. Out: llama-server processes started with the plan's argv, their logged
buffers beside the plan's, and the devices' memory after load. The llama.cpp tool drivers (tool_runs:
llama-fit-params, llama-server, their logs parsed) and `validate --engine llama.cpp` (validate_llama) live here.
"""
