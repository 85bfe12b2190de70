"""ggml's backend scheduler re-implemented (imports only planner.core).

In: a graph of tensors and a list of backends. Out: the five passes' assignment, splits with
their input copies, allocated buffers, computed tensors (numpy kernels; bit-exact ones for
ggml-cpu's portable x86-64 build). Shaped as ggml-backend (seed 000): reg -> device -> backend,
buffer type -> buffer; split -> allocate -> compute.
"""
