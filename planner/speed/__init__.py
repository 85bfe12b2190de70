"""The speed model (above memory).

In: model facts, a cost table, a placement view and the inventory's rates. Out: predicted tokens/s
(throughput, tensor_throughput), the batch-N decode step (step_model), and the pure least-squares fit
that turns measured times into rates (calibration_fit).
"""
