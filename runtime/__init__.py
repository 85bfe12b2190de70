"""fitplan runtime: an embedded re-implementation of ggml's backend scheduler.

Modules follow ggml-backend's shape (seed 000): `devices` (registry -> device -> backend,
buffer type -> buffer; numpy CPU and virtual GPUs), `graph` (tensors, graphs, ops) and
`build` (op constructors with ggml's shape rules), `sched` (the Scheduler: split ->
allocate -> compute) calling `passes` (passes 1-4, one function each) and `splits` (pass 5/6),
`alloc` (the graph allocator), `compute` (running splits, input and expert copies),
`kernels` (numpy kernels, one table entry per op) and `debug` (GGML_SCHED_DEBUG=2 text).
"""
