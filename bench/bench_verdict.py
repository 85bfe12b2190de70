"""`plan --verdict`'s ranking against real llama-server processes: (a) one endpoint per device against (b) one split
over all devices, under a bounded concurrent load.

    python -m bench.bench_verdict [--calibrated INVENTORY.yaml] [--rounds 3] [--requests-per-client 3]
                                  [--n-predict 48] [--max-load 1.5]

For each combination in COMBINATIONS (two and three loopback ggml-rpc-servers standing in for devices, × one and
four concurrent clients) it asks planner/search/verdict.py for its prediction (from an inventory `fitplan
calibrate` fits on the same rpc-servers, unless --calibrated gives one), starts each arrangement's llama-server
processes with the verdict's arguments (plus `-t 1`), and sends a fixed number of `/completion` requests from N
client threads, each keeping to its endpoint as a round-robin balancer assigns it. Measured: for one client the
mean decode tokens/s llama-server reports (`timings.predicted_per_second`); for N clients all decoded tokens over
the load's wall time. Each arrangement runs --rounds times, (a) and (b) alternating with fresh processes, and the
medians are ranked: (a) > (b), (a) < (b), or a tie within verdict.TIE_FRACTION (5 %), against the predicted
ranking (the strict comparison is counted too). (c), the fastest device with host offload, is printed as
predicted only. Pinning: rpc-server i on core i mod cores, an endpoint of (a) on its device's core, the split's
llama-server on every core; each core runs a lowest-priority busy loop while measuring (--keep-awake). All the
"devices" share two cores and one memory bus: the verdict models the shared cores, not the bus, and the summary
prints each arrangement's measured/predicted ratio. Measures only below --max-load; asserts nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from bench.quiet import NotQuiet, cores_kept_awake, load1, load_line, wait_for_quiet
from planner.hardware.budgets import resolve_budgets
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.measuring.calibrate import CalibrateRequest, calibrate
from planner.measuring.llama_bench import Workload
from planner.registry.examples import resolve_model
from planner.running.tool_runs import start_server, wait_ready
from planner.search.result import PlanRequest
from planner.search.verdict import TIE_FRACTION, Arrangement, Verdict, relation, verdict
from planner.speed.calibration_fit import CalibrationError
from planner.speed.step_model import Endpoint
from planner.system.llama_tools import LOOPBACK, ensure_tools, free_port, rpc_servers, stop_process

MODEL = "example:gemma3-270m"
CTX_PER_CLIENT = 512
PROMPT = "The quick brown fox jumps over the lazy dog. Then"
PROMPT_TOKENS = 12           # about; the cache holds this plus half the generation on average
N_CORES = os.cpu_count() or 1
REQUEST_TIMEOUT_S = 300


@dataclass(frozen=True)
class Combination:
    n_devices: int
    n_clients: int

    @property
    def name(self) -> str:
        return f"{self.n_devices} rpc devices x {self.n_clients} client(s)"


COMBINATIONS = (Combination(2, 1), Combination(2, 4), Combination(3, 1), Combination(3, 4))


@dataclass(frozen=True)
class Measured:
    stream_tokens_s: float       # mean decode tokens/s of a request, as llama-server times it
    clients_tokens_s: float      # decoded tokens of all requests / wall time of the load
    n_requests: int
    load: str


@dataclass(frozen=True)
class Row:
    combination: Combination
    predicted: dict[Arrangement, float]
    rounds: dict[Arrangement, list[Measured]]    # one measurement per round, (a) and (b) alternating

    def metric(self, m: Measured) -> float:
        return m.clients_tokens_s if self.combination.n_clients > 1 else m.stream_tokens_s

    def key(self, arrangement: Arrangement) -> float:
        """The median over the rounds of the ranked metric."""
        return statistics.median(self.metric(m) for m in self.rounds[arrangement])

    def loads(self, arrangement: Arrangement) -> str:
        return ", ".join(m.load for m in self.rounds[arrangement])

    @property
    def predicted_winner(self) -> Arrangement:
        return max((Arrangement.ENDPOINTS, Arrangement.SPLIT), key=lambda a: self.predicted[a])

    @property
    def measured_winner(self) -> Arrangement:
        return max((Arrangement.ENDPOINTS, Arrangement.SPLIT), key=self.key)

    @property
    def predicted_relation(self) -> str:
        """(a) against (b) as the verdict ranks them: >, < or ≈ (within verdict.TIE_FRACTION)."""
        return relation(self.predicted[Arrangement.ENDPOINTS], self.predicted[Arrangement.SPLIT])

    @property
    def measured_relation(self) -> str:
        """The same comparison, with the same tie band, of what was measured."""
        return relation(self.key(Arrangement.ENDPOINTS), self.key(Arrangement.SPLIT))

    @property
    def agrees(self) -> bool:
        return self.predicted_relation == self.measured_relation

    @property
    def agrees_strictly(self) -> bool:
        """Without ties: the larger of each pair, however small the gap."""
        return self.predicted_winner is self.measured_winner


# ------------------------------------------------------------------------------- processes

def core_of(i: int) -> str:
    return str(i % N_CORES)


def _with_port(argv: tuple[str, ...], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out + ["--host", LOOPBACK, "-t", "1"]


def _cores(e: Endpoint, inventory: Inventory) -> str:
    """An endpoint on one device runs on that device's core; a split's on every core."""
    if len(e.devices) == 1:
        return core_of(inventory.names.index(e.devices[0]))
    return f"0-{N_CORES - 1}"


# ------------------------------------------------------------------------------- the load

def completion(port: int, n_predict: int) -> dict:
    body = {"prompt": PROMPT, "n_predict": n_predict, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def run_load(ports: list[int], requests_per_client: int, n_predict: int) -> tuple[list[dict], float]:
    """One thread per client, client j on ports[j], each sending its requests one after another."""
    results: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(port: int) -> None:
        for _ in range(requests_per_client):
            try:
                doc = completion(port, n_predict)
            except BaseException as e:   # recorded and re-raised in the main thread
                with lock:
                    errors.append(e)
                return
            with lock:
                results.append(doc)

    threads = [threading.Thread(target=client, args=(p,), daemon=True) for p in ports]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S * requests_per_client)
    wall = time.monotonic() - start
    if errors:
        raise errors[0]
    return results, wall


def measure(bin_dir: Path, option_endpoints: tuple[Endpoint, ...], inventory: Inventory, n_clients: int,
            args: argparse.Namespace, logs: Path) -> Measured:
    procs: list[subprocess.Popen] = []
    ports: list[int] = []
    before = load1()
    try:
        for i, e in enumerate(option_endpoints):
            port = free_port()
            log_path = logs / f"server-{len(list(logs.iterdir()))}-{i}.log"
            argv = ["taskset", "-c", _cores(e, inventory), str(bin_dir / "llama-server"), *_with_port(e.argv, port)]
            proc = start_server(argv, log_path)
            procs.append(proc)
            wait_ready(proc, port, log_path)
            ports += [port] * e.n_slots
            completion(port, 4)   # warm-up, not counted
        results, wall = run_load(ports[:n_clients], args.requests_per_client, args.n_predict)
    finally:
        for proc in procs:
            stop_process(proc)
    decoded = sum(int(r["timings"]["predicted_n"]) for r in results)
    stream = statistics.mean(float(r["timings"]["predicted_per_second"]) for r in results)
    return Measured(stream, decoded / wall, len(results), f"{before:.2f}->{load1():.2f}")


# ------------------------------------------------------------------------------- the run

def predicted(v: Verdict, n_clients: int) -> dict[Arrangement, float]:
    return {o.arrangement: (o.clients_tokens_s if n_clients > 1 else o.stream_tokens_s) for o in v.options}


def run_combination(bin_dir: Path, model: str, combo: Combination, endpoints: list[str], calibrated: Inventory,
                    args: argparse.Namespace, logs: Path) -> Row:
    inventory = replace(detect_inventory(endpoints[:combo.n_devices]), calibration=calibrated.calibration)
    v = verdict(model, inventory, resolve_budgets(inventory), PlanRequest(n_ctx=CTX_PER_CLIENT),
                n_clients=combo.n_clients, n_past=PROMPT_TOKENS + args.n_predict // 2)
    print(f"\n== {combo.name}: predicted")
    print(v.to_table())
    measured: dict[Arrangement, list[Measured]] = {Arrangement.ENDPOINTS: [], Arrangement.SPLIT: []}
    for k in range(1, args.rounds + 1):
        for arrangement in measured:
            option = v.option(arrangement)
            wait_for_quiet(args.max_load, args.deadline, args.busy_loops)
            m = measure(bin_dir, option.endpoints, inventory, combo.n_clients, args, logs)
            measured[arrangement].append(m)
            print(f"  round {k} measured {arrangement.value:<9}: one stream {m.stream_tokens_s:6.1f} tokens/s, "
                  f"{combo.n_clients} clients {m.clients_tokens_s:6.1f} tokens/s ({m.n_requests} requests, "
                  f"load {m.load})", flush=True)
    return Row(combo, predicted(v, combo.n_clients), measured)


def table(rows: list[Row]) -> list[str]:
    out = ["| combination | metric | (a) predicted | (a) measured | (b) predicted | (b) measured | predicted "
           "ranking | measured ranking | agrees | load (a); (b) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = Arrangement.ENDPOINTS, Arrangement.SPLIT
        metric = f"{r.combination.n_clients} clients tokens/s" if r.combination.n_clients > 1 else "1 stream tokens/s"
        out.append(f"| {r.combination.name} | {metric} | {r.predicted[a]:.1f} | {r.key(a):.1f} ({_rounds(r, a)}) | "
                   f"{r.predicted[b]:.1f} | {r.key(b):.1f} ({_rounds(r, b)}) | (a) {r.predicted_relation} (b) | "
                   f"(a) {r.measured_relation} (b) | {'yes' if r.agrees else 'no'} | {r.loads(a)}; {r.loads(b)} |")
    return out


def _rounds(r: Row, a: Arrangement) -> str:
    return "/".join(f"{r.metric(m):.1f}" for m in r.rounds[a])


def summary(rows: list[Row]) -> list[str]:
    agree = sum(r.agrees for r in rows)
    lines = [f"rankings agree for {agree} of {len(rows)} combinations (target: at least 3 of 4); a gap within "
             f"{TIE_FRACTION:.0%} is a tie (≈) on both sides, as plan --verdict prints it",
             f"without ties (the larger of each pair, however small the gap): {sum(r.agrees_strictly for r in rows)} "
             f"of {len(rows)}"]
    for r in rows:
        ratios = ", ".join(f"{a.value} measured/predicted {r.key(a) / r.predicted[a]:.2f}"
                           for a in (Arrangement.ENDPOINTS, Arrangement.SPLIT) if r.predicted[a])
        lines.append(f"  {r.combination.name}: {ratios}" + ("" if r.agrees else "  <- differs"))
    lines.append(f"CPU contention: this machine has {N_CORES} cores and one memory bus; every rpc-server (one thread, "
                 f"rpc-server i on core i mod {N_CORES}) and llama-server shares them. The prediction divides each "
                 "core over the rpc-servers computing on it at once (three devices: two on one core, half a core "
                 "each) and ends the four clients' equal load with the slowest; what it does not model is the one "
                 "memory bus all weight streams contend on and the llama-server processes' own CPU time. The "
                 "measured/predicted ratios above carry that gap.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrated", type=Path, help="a calibrated inventory (default: calibrate on the bench's "
                    "own rpc-servers first)")
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="measure (a) and (b) this many times each, alternating "
                    "(fresh processes every time); the ranking compares the medians (the calibration runs its "
                    "placements in as many round-robin rounds)")
    ap.add_argument("--max-load", type=float, default=1.5, help="measure only below this 1-minute load average")
    ap.add_argument("--max-wait-s", type=float, default=1800, help="give up waiting for a quiet machine after this")
    ap.add_argument("--markdown", type=Path, help="also write the table and the summary here")
    ap.add_argument("--keep-awake", action=argparse.BooleanOptionalAction, default=True,
                    help="keep every core busy with a lowest-priority loop while measuring (bench/quiet.py "
                    "cores_kept_awake; default on): a process woken on a halted core starts without waiting "
                    "for the hypervisor")
    args = ap.parse_args()
    args.deadline = time.monotonic() + args.max_wait_s
    print(f"== verdict measured: {len(COMBINATIONS)} combinations, model {MODEL}, context {CTX_PER_CLIENT} per "
          f"client, {args.requests_per_client} requests per client of {args.n_predict} tokens, {args.rounds} rounds "
          "of (a) then (b)")
    for i, c in enumerate(COMBINATIONS):
        print(f"  {i + 1}. {c.name}")
    bin_dir = ensure_tools()
    model = resolve_model(MODEL)
    n_rpc = max(c.n_devices for c in COMBINATIONS)
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-verdict-") as tmp:
        logs = Path(tmp)
        rows: list[Row] = []
        # rpc-server i pinned to core i mod cores, one thread each
        with contextlib.ExitStack() as stack, \
                rpc_servers(n_rpc, bin_dir, log_dir=logs, prefix=lambda i: ["taskset", "-c", core_of(i)],
                            args=["-t", "1"]) as endpoints:
            try:
                wait_for_quiet(args.max_load, args.deadline)
                print(f"load average at start: {load_line()}")
                # started after the first wait: their own load would hold it up
                cores = sorted(os.sched_getaffinity(0)) if args.keep_awake else []
                args.busy_loops = len(stack.enter_context(cores_kept_awake(cores)))
                if args.calibrated:
                    calibrated = load_inventory(args.calibrated)
                else:
                    print("calibrating on these rpc-servers (fitplan calibrate) ...", flush=True)
                    try:
                        request = CalibrateRequest(tuple(endpoints), work=Workload(128, 16, 0, 2), rounds=args.rounds)
                        result = calibrate(request, bin_dir)
                        print(result.to_table())
                        calibrated = result.inventory
                    except CalibrationError as e:
                        # a busy machine: predict from the stated/assumed rates, which the table then says
                        print(f"calibration failed ({e}); predicting from assumed rates: compare rankings only")
                        calibrated = replace(detect_inventory(endpoints), calibration=None)
                for c in COMBINATIONS:
                    rows.append(run_combination(bin_dir, model, c, endpoints, calibrated, args, logs))
                print(f"load average at end: {load_line()}")
            except NotQuiet as e:
                print(f"stopped: {e}; {len(rows)} of {len(COMBINATIONS)} combinations measured")
    if not rows:
        sys.exit("nothing measured")
    lines = table(rows) + [""] + summary(rows)
    print("\n" + "\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
