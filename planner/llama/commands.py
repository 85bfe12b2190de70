"""The commands a plan prints: one argument vector, and the shell lines made from it.

A plan's argument vector (`plan_argv`) is what llama-server and llama-cli take after their name;
every printed line is `shlex.join` of a program and a vector, so bash gives back exactly that
vector (a regex such as `blk\\.(3|4)\\.ffn_(up|down)_exps=CPU` is quoted, not re-read by the shell).

llama-bench spells the same placement differently (tools/llama-bench/llama-bench.cpp of the pinned
build, seed 003 §8): a `,` inside a value starts another test row, so lists use `/` (`-dev`, `-ts`)
and every override goes into one `-ot` joined with `;`. A pattern that itself holds `,` or `;`
cannot be written there; `bench_argv` then says so instead of printing a line that measures
another placement.
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from planner.llama.flags import FLAGS, LlamaFlags, OverrideKind, arg, bench_arg, has_flag
from planner.llama.programs import Program

LLAMA_SERVER = "llama-server"
# what a plan's rows are sized for: the llama-server (and llama-cli, which runs it) load its commands
# start, not llama-fit-params' dry run (planner/llama/programs.py says how the two differ)
PLANNED_PROGRAM = Program.SERVER
LLAMA_CLI = "llama-cli"
LLAMA_BENCH = "llama-bench"
# llama-bench's own defaults (cmd_params_defaults), spelled out so that -d can be chosen against them
BENCH_N_PROMPT = 512
BENCH_N_GEN = 128
BENCH_NGL_ALL = "999"   # llama-bench has no "auto"/"all" spelling for -ngl; more than any model's layers
_BENCH_SEPARATORS = (",", ";")   # ',' starts another test row, ';' another override in llama-bench's -ot


def command_line(program: str, argv: Sequence[str]) -> str:
    """One shell line that bash splits back into `[program, *argv]`, byte for byte."""
    return shlex.join([program, *argv])


def model_args(location: str) -> list[str]:
    """The model as llama.cpp's common arguments name it: `-m PATH`, or `-mu URL` for a URL."""
    return arg("model_url", location) if location.startswith(("http://", "https://")) else arg("model", location)


def server_argv(model: str, flag_argv: Sequence[str], n_parallel: int) -> list[str]:
    """llama-server's / llama-cli's arguments: the model, then the flags with `-np` stated
    (llama-server's default is 4 slots sharing a unified cache, llama-cli's and llama-fit-params'
    is 1; a plan sizes its cache for `n_parallel`)."""
    flags = list(flag_argv)
    if not has_flag("n_parallel", flags):
        flags += arg("n_parallel", n_parallel)
    return model_args(model) + flags


@dataclass(frozen=True)
class BenchArgv:
    """llama-bench's arguments for a placement, or None with the reason it cannot be written
    (with arguments, `note` names what llama-bench does not measure)."""

    argv: tuple[str, ...] | None
    note: str = ""


def _bench_overrides(f: LlamaFlags) -> tuple[list[str], str]:
    """The overrides as llama-bench arguments: every pattern in one `-ot`, in llama.cpp's order
    (the first match wins in both), or a note on the pattern that cannot be written there."""
    args = f.override_args
    kinds = [a.kind for a in args]
    out: list[str] = []
    items = list(f.overrides)
    if kinds.count(OverrideKind.NCMOE) == 1 and set(kinds) <= {OverrideKind.OT, OverrideKind.NCMOE}:
        i = kinds.index(OverrideKind.NCMOE)
        # llama-bench appends -ncmoe's patterns after every -ot pattern (cmd_params_instance::
        # to_llama_mparams); that moves no tensor when the -ot patterns that follow -ncmoe on
        # llama.cpp's command line send theirs to the CPU too. Otherwise the patterns are spelled out.
        if all(o.target == "CPU" for o in LlamaFlags(override_args=args[i + 1:]).overrides):
            out = bench_arg("n_cpu_moe", args[i].value)
            items = list(LlamaFlags(override_args=args[:i] + args[i + 1:]).overrides)
    bad = next((o for o in items if any(c in o.pattern + o.target for c in _BENCH_SEPARATORS)), None)
    if bad is not None:
        return [], (f"no llama-bench line: the override {bad.pattern}={bad.target} cannot be written for the "
                    "pinned llama-bench, whose -ot reads ',' as another test row and ';' as another override")
    if items:
        out = bench_arg("override_tensor", ";".join(f"{o.pattern}={o.target}" for o in items)) + out
    return out, ""


def _bench_settings(f: LlamaFlags) -> list[str]:
    """The settings other than the placement lists, each where it differs from llama-bench's default."""
    d = LlamaFlags()
    pairs = [(bench_arg("cache_type_k", f.cache_type_k) + bench_arg("cache_type_v", f.cache_type_v),
              (f.cache_type_k, f.cache_type_v) != ("f16", "f16")),
             (bench_arg("n_ubatch", f.n_ubatch), f.n_ubatch != d.n_ubatch),
             (bench_arg("n_batch", f.n_batch), f.n_batch != d.n_batch),
             (bench_arg("flash_attn", 1 if f.flash_attn == "on" else 0), f.flash_attn != d.flash_attn),
             (bench_arg("no_op_offload"), not f.op_offload), (bench_arg("no_repack"), not f.repack),
             (bench_arg("main_gpu", f.main_gpu), f.main_gpu != d.main_gpu),
             (bench_arg("no_kv_offload"), not f.kv_offload), (bench_arg("no_host"), f.no_host)]
    return [a for args, on in pairs if on for a in args]


def bench_argv(model: str, f: LlamaFlags, n_ctx: int) -> BenchArgv:
    """The placement in llama-bench's syntax: one test row per kind of test (pp, tg) measuring it,
    the prompt test at the context `n_ctx` (`-d` = context - prompt: llama-bench sizes a test's
    context as n_prompt + n_gen + n_depth)."""
    overrides, note = _bench_overrides(f)
    if note:
        return BenchArgv(None, note)
    ngl = BENCH_NGL_ALL if f.n_gpu_layers < 0 else str(f.n_gpu_layers)
    out = bench_arg("model", model) + bench_arg("n_gpu_layers", ngl) + bench_arg("split_mode", f.split_mode)
    if f.rpc:
        out += bench_arg("rpc", f.rpc)   # not a test parameter: ',' separates servers here
    if f.devices:
        out += bench_arg("devices", f.devices)
    if f.tensor_split:
        out += bench_arg("tensor_split", f.tensor_split)
    depth = max(n_ctx - BENCH_N_PROMPT, 0)
    argv = tuple(out + overrides + _bench_settings(f) + bench_arg("n_prompt", BENCH_N_PROMPT)
                 + bench_arg("n_gen", BENCH_N_GEN) + bench_arg("n_depth", depth))
    # llama-bench runs one sequence, loads the target alone and has no such options: the line
    # measures the placement, not them
    unmeasured = [FLAGS[key].names[0] for key, on in (
        ("n_parallel", f.n_parallel > 1), ("swa_full", f.swa_full), ("kv_unified", f.kv_unified),
        ("draft_model", f.spec.has_draft), ("mmproj", bool(f.mmproj.path)), ("lora", bool(f.loras))) if on]
    return BenchArgv(argv, f"llama-bench runs one sequence of the target alone: {' '.join(unmeasured)} not measured"
                     if unmeasured else "")
