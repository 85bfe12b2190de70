"""The search for the best placement (above memory).

In: a `PlanRequest`, a model, an `Inventory` and budgets. Out: a `PlanResult`: the chosen
flags, each device's estimate, the predicted throughput, `--explain` text, and the deployment
document (its writer and reader share one schema).
"""
