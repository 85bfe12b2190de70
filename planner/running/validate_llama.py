"""`fitplan validate --engine llama.cpp`: the check planner.checking prepares, run by the pinned
llama.cpp tools on loopback (planner/running/tool_runs.py validate_llama): llama-server loads the
model under the flags, with an rpc-server standing for each device, and its log's buffers are set
beside the estimate of the plan's llama-server line.
"""
from __future__ import annotations

from planner.checking.validate import prepare_validation, server_predicted
from planner.checking.validation_report import ValidateReport, ValidateRequest
from planner.core.choices import Engine
from planner.running.tool_runs import validate_llama


def validate_with_llama(req: ValidateRequest, reserve_only: bool = False) -> ValidateReport:
    """reserve_only is refused here (the embedded engine's scheduler alone reserves without weights),
    with the message `validate` gives."""
    ctx, settings, _ = prepare_validation(req, Engine.LLAMA_CPP, reserve_only)
    return validate_llama(req, ctx, server_predicted(settings, req.inventory))
