"""Many estimates or plans over axes, and pictures of them (above planning).

In: a model, axes (`ctx`, `cache`, `np`, `ub`, `ts`, `budget`), an inventory. Out: a
`SweepResult` (CSV rows) and matplotlib pictures of sweeps and plans.
"""
