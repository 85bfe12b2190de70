"""`fitplan plan` against llama.cpp's own `--fit` (llama-fit-params) on the same budgets.

    python -m bench.bench_plan_vs_fit                  # the peer test's matrix
    python -m bench.bench_plan_vs_fit --wide           # plus every model at equal budgets 100 MiB .. 4 GiB
    python -m bench.bench_plan_vs_fit --only llama-8b

Runs each case of tests/peer/test_plan_vs_fit.py (two loopback rpc-servers, budgets emulated by
llama.cpp's --fit-target margins) and prints a Markdown table: llama.cpp's context, -ngl, model
bytes on RPC0+RPC1 and wall time; the same for fitplan's `--ctx max` plan and its plan at
llama.cpp's context; and whether llama.cpp's dry run (`--fit-print on`) of each fitplan plan stays
within every budget (its largest device total against that device's budget, in MiB). Then a
summary: cases where fitplan reached llama.cpp's context, kept as many bytes on the devices, and
was confirmed by llama.cpp.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from planner.system.llama_tools import ensure_tools, rpc_servers
from tests.peer.test_plan_vs_fit import CASES, DEVICES, Case, Outcome, Side, run_case
from tests.support.estimate_matrix import MODELS

MIB = 2**20
WIDE_BUDGETS_MIB = (100, 256, 512, 1024, 2048, 4096)


def _cases(wide: bool, only: str | None) -> list[Case]:
    cases = list(CASES)
    if wide:
        known = set(cases)
        cases += [c for m in MODELS for b in WIDE_BUDGETS_MIB if (c := Case(m, (b, b))) not in known]
    return [c for c in cases if not only or c.model == only]


def _confirmed(side: Side, case: Case) -> tuple[bool, str]:
    """Within every budget by llama.cpp's printed MiB; shown as the tightest device's used/budget."""
    used = {d: side.printed_total_mib(d) for d in DEVICES}
    budget = dict(zip(DEVICES, case.budgets_mib, strict=True))
    tight = max(DEVICES, key=lambda d: used[d] / budget[d])
    ok = all(used[d] <= budget[d] for d in DEVICES)
    return ok, f"{'yes' if ok else 'NO'} ({used[tight]}/{budget[tight]})"


def _fitplan_ok(out: Outcome) -> bool:
    """fitplan reached llama.cpp's context, kept as many weight bytes on the devices (unless llama.cpp's
    own choice broke a budget), and stayed within every budget."""
    ll, cx, at = out.llama, out.by_context, out.at_llama_ctx
    more_bytes = at.device_model_bytes >= ll.device_model_bytes or not _confirmed(ll, out.case)[0]
    return cx.n_ctx >= ll.n_ctx and more_bytes and _confirmed(cx, out.case)[0] and _confirmed(at, out.case)[0]


def _row(out: Outcome) -> list[str]:
    ll, cx, at = out.llama, out.by_context, out.at_llama_ctx
    ll_text = _confirmed(ll, out.case)[1]
    mark = "" if _fitplan_ok(out) else " ✗"
    return [out.case.label + mark,
            str(ll.n_ctx), str(ll.n_gpu_layers), f"{ll.device_model_bytes / MIB:.0f}", f"{ll.seconds:.1f}",
            ll_text,
            str(cx.n_ctx), str(cx.n_gpu_layers), f"{cx.device_model_bytes / MIB:.0f}", f"{cx.seconds:.2f}",
            str(at.n_gpu_layers), f"{at.device_model_bytes / MIB:.0f}", f"{at.seconds:.2f}",
            _confirmed(cx, out.case)[1], _confirmed(at, out.case)[1]]


HEADER = ["case (budgets RPC0+RPC1)",
          "llama ctx", "llama -ngl", "llama MiB on dev", "llama s", "llama in budget",
          "fitplan max ctx", "-ngl", "MiB on dev", "s",
          "fitplan @llama ctx -ngl", "MiB on dev", "s",
          "llama.cpp confirms (max ctx)", "llama.cpp confirms (@llama ctx)"]


def _print_header() -> None:
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "|".join("---" if i == 0 else "--:" for i in range(len(HEADER))) + "|")


def _summary(outcomes: list[Outcome], errors: list[str]) -> None:
    n = len(outcomes)
    ctx_ok = sum(o.by_context.n_ctx >= o.llama.n_ctx for o in outcomes)
    ctx_more = sum(o.by_context.n_ctx > o.llama.n_ctx for o in outcomes)
    fair = [o for o in outcomes if _confirmed(o.llama, o.case)[0]]   # llama.cpp's choice within its budgets
    bytes_ok = sum(o.at_llama_ctx.device_model_bytes >= o.llama.device_model_bytes for o in fair)
    bytes_more = sum(o.at_llama_ctx.device_model_bytes > o.llama.device_model_bytes for o in fair)
    confirmed = sum(_confirmed(o.by_context, o.case)[0] and _confirmed(o.at_llama_ctx, o.case)[0] for o in outcomes)
    gain = [(o.at_llama_ctx.device_model_bytes - o.llama.device_model_bytes) / MIB for o in fair]
    print()
    print(f"cases: {n} ({len(errors)} errors)")
    print(f"fitplan --ctx max context >= llama.cpp's: {ctx_ok}/{n} (larger in {ctx_more})")
    print(f"fitplan at llama.cpp's context, weights on devices >= llama.cpp's: {bytes_ok}/{len(fair)} "
          f"(more in {bytes_more}; cases where llama.cpp's own choice is within its budgets)")
    if gain:
        print(f"  extra MiB on devices: median {statistics.median(gain):.0f}, min {min(gain):.0f}, max {max(gain):.0f}")
    print(f"both fitplan plans within every budget by llama.cpp's --fit-print: {confirmed}/{n}")
    over = [o.case.label for o in outcomes if not _confirmed(o.llama, o.case)[0]]
    print(f"llama.cpp's own --fit choice over a budget by its own --fit-print: {len(over)}/{n}"
          + (f" ({', '.join(over)})" if over else ""))
    llama_s = [o.llama.seconds for o in outcomes]
    plan_s = [o.by_context.seconds + o.at_llama_ctx.seconds for o in outcomes]
    if outcomes:
        print(f"wall time per case: llama-fit-params median {statistics.median(llama_s):.1f} s, "
              f"fitplan (both plans) median {statistics.median(plan_s):.2f} s")
    for line in errors:
        print(f"  error: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="add every model at equal budgets 100 MiB .. 4 GiB")
    parser.add_argument("--only", help="one model name")
    args = parser.parse_args()
    bin_dir = ensure_tools()
    outcomes, errors = [], []
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-") as tmp, rpc_servers(2, bin_dir) as endpoints:
        _print_header()
        for case in _cases(args.wide, args.only):
            try:
                out = run_case(bin_dir, endpoints, case, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a bench reports every case and goes on
                errors.append(f"{case.label}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            outcomes.append(out)
            print("| " + " | ".join(_row(out)) + " |", flush=True)
    _summary(outcomes, errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
