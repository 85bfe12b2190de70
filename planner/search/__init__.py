"""The search for the best placement (above speed).

In: a `PlanRequest`, a model, an `Inventory` and budgets. Out: a `PlanResult`: the chosen flags, each
device's estimate, the predicted throughput and the `--explain` text; plan sets and `plan --verdict`'s
arrangements.
"""
