"""Which llama.cpp program a figure is for: the same flags allocate different compute buffers in
llama-fit-params' dry run and in llama-server's load. llama-cli of the pin runs llama-server inside
itself (tools/cli/cli-server.h, linked against llama-server-impl), so it loads as llama-server does.

Two things differ (src/llama-context.cpp of the pin):
- the output rows reserved: the worst-case prompt graph computes logits for min(n_tokens,
  cparams.n_outputs_max) rows, and n_outputs_max is n_batch unless the program sets it.
  llama-fit-params leaves it at 0 (n_batch); llama-server sets it to -np x (1 + the longest draft)
  (tools/server/server-context.cpp server_output_limits; planner.llama.companions.server_outputs_max).
  On the device that holds the output that is n_vocab x rows x 4 B of logits: 512 rows of a 128k
  vocabulary is 250 MiB llama-server never allocates.
- how the reserve runs: llama-fit-params sizes with no_alloc (ggml_backend_sched_reserve_size, which
  resets the scheduler first and so forgets the layer-norm pins set while the graph was built); a
  real load reserves with ggml_backend_sched_reserve and keeps them (runtime/engine/runner.py
  ModelRunner.reserve says what moves).
And llama-server's -np defaults to auto: 4 slots sharing one unified cache (tools/server/server.cpp),
where every other program's default is 1 (common/common.h n_parallel).
"""
from __future__ import annotations

from planner.core.choices import Program
from planner.llama.companions import server_target_outputs_max
from planner.llama.flags import LlamaFlags, arg, has_flag

PROGRAM_NAMES: dict[Program, str] = {Program.FIT_PARAMS: "llama-fit-params' dry run",
                                     Program.SERVER: "llama-server's load"}


# tools/server/server.cpp: -np auto (llama-server's default, common/arg.cpp) becomes 4 slots with kv_unified
SERVER_AUTO_PARALLEL = (*arg("n_parallel", 4), *arg("kv_unified"))


def program_argv(program: Program, argv: list[str]) -> list[str]:
    """The flags as the program reads them: llama-server without -np takes its auto slots, which also
    turn the unified cache on whatever else the flags say (so they come last)."""
    if program is Program.SERVER and not has_flag("n_parallel", argv):
        return [*argv, *SERVER_AUTO_PARALLEL]
    return argv


def effective_program(program: Program, flags: LlamaFlags) -> Program:
    """Companions (a drafter, a projector, adapters) load only in llama-server: flags that name one
    are sized as llama-server loads them, whatever program was asked for."""
    return Program.SERVER if flags.has_companions else program


def outputs_max(program: Program, flags: LlamaFlags) -> int | None:
    """cparams.n_outputs_max the program gives its target's context; None is n_batch (the library's
    default when the caller sets 0)."""
    return server_target_outputs_max(flags) if program is Program.SERVER else None


def dry_run(program: Program) -> bool:
    """Whether the program sizes its compute buffers with the no_alloc reserve."""
    return program is Program.FIT_PARAMS
