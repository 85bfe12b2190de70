"""What a plan is written as (above search).

In: a `PlanResult` (or a plan set). Out: the deployment document, exports (systemd, compose, presets),
the text and HTML reports.
"""
