"""Plans whose printed commands are checked: shapes from planner/synth/shapes_common.py (and the Gemma
example) on several inventories, MoE expert overrides included. tests/cli/test_commands_cli.py
parses each printed line with bash; tests/peer/test_commands_peer.py also runs each RPC case's
argument vector through llama-fit-params on two loopback rpc-servers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.estimate_matrix import model_path

# two RPC devices; "{ep0}"/"{ep1}" become the rpc-servers' endpoints (fixed ports off the peer tests)
OFFLINE_ENDPOINTS = ("127.0.0.1:50052", "127.0.0.1:50053")
CPU_ONLY = str(Path(__file__).resolve().parents[2] / "configs" / "devices" / "cpu-only.yaml")


def _rpc(mib0: int, mib1: int) -> tuple[str, ...]:
    return (f"RPC0={mib0}MiB@{{ep0}}", f"RPC1={mib1}MiB@{{ep1}}")


@dataclass(frozen=True)
class PlanCase:
    model: str                   # a planner/synth/shapes_common.py name, or gemma3-270m (the example file)
    devices: tuple[str, ...]     # --device shorthands
    options: tuple[str, ...]     # the other `fitplan plan` options
    expect: str = ""             # a fragment the plan's argv must hold (the case exists to show it)

    @property
    def checkable(self) -> bool:
        """No local GPU named: llama-fit-params can check it here (rpc-servers on loopback, the CPU)."""
        return all("@" in d for d in self.devices)

    @property
    def label(self) -> str:
        devs = "+".join(d.split("@")[0] for d in self.devices) or "cpu"
        return f"{self.model} {devs} {' '.join(self.options)}".strip()

    def argv(self, directory: Path, endpoints: tuple[str, ...] | list[str] = OFFLINE_ENDPOINTS) -> list[str]:
        """`fitplan plan` arguments for this case."""
        out = ["plan", str(model_path(self.model, directory))]
        for d in self.devices:
            out += ["--device", d.format(ep0=endpoints[0], ep1=endpoints[1])]
        budgets = ",".join(d.split("@")[0] for d in self.devices)
        return out + (["--max-vram", budgets] if budgets else []) + list(self.options)


CASES: tuple[PlanCase, ...] = (
    PlanCase("gemma3-270m", _rpc(100, 100), ("--ram", "4GiB", "--ctx", "4096"), expect=r"^token_embd\.weight=CPU"),
    PlanCase("gemma3-270m", _rpc(256, 128), ("--ram", "4GiB", "--ctx", "max", "--objective", "context")),
    PlanCase("gemma3-270m", (), ("--devices", CPU_ONLY, "--ram", "4GiB", "--ctx", "4096", "--parallel", "2"),
             expect="-np"),
    PlanCase("llama-8b", _rpc(2048, 1024), ("--ram", "64GiB", "--ctx", "4096", "--cache-type", "q8_0")),
    PlanCase("qwen3moe-30b-a3b", _rpc(4096, 4096), ("--ram", "64GiB", "--ctx", "8192"), expect="_(ch|)exps=CPU"),
    PlanCase("qwen3moe-30b-a3b", _rpc(6144, 2048), ("--ram", "64GiB", "--ctx", "4096", "--parallel", "2")),
    PlanCase("gpt-oss-20b", _rpc(3072, 3072), ("--ram", "64GiB", "--ctx", "4096")),
    PlanCase("deepseek2-mla", _rpc(2048, 2048), ("--ram", "64GiB", "--ctx", "4096")),
    # 6 GiB: at 8 GiB, once ggml-cuda's fusion keeps the MoE reduction's tensors alive (+41 MiB of
    # compute), the plan keeps layer 0 whole on the host and experts 1-32 there, an -ot list, not -ncmoe
    PlanCase("qwen3moe-30b-a3b", ("CUDA0=6GiB",), ("--ram", "64GiB", "--ctx", "8192"), expect="-ncmoe"),
    # cards of 12 and 6 GiB beside the CUDA overhead each holds (the experts still split by -ot rules)
    PlanCase("qwen3moe-30b-a3b", ("CUDA0=12884MiB", "CUDA1=6740MiB"), ("--ram", "64GiB", "--ctx", "8192"),
             expect=r"blk\.("),
)
