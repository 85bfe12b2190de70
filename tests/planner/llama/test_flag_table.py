"""One table of llama.cpp's flags (planner/llama/flags.py FLAGS) both parses and writes argv: every
spelling belongs to one entry, what fitplan writes for a plan parses back to the plan's settings,
llama-bench's line reads back to the same placement, and no other module of planner/ spells a flag
of the table itself."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planner.core.units import GiB, MiB
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.commands import BENCH_NGL_ALL, bench_argv
from planner.llama.context import model_context
from planner.llama.flags import (
    FLAGS,
    DraftFlags,
    LlamaFlags,
    LoraArg,
    MmprojFlags,
    OverrideArg,
    OverrideKind,
    SpecFlags,
    Tool,
    Use,
    arg,
    bench_arg,
    flags_to_argv,
    parse_llama_flags,
    takes_value,
    to_bench_argv,
)
from planner.memory.estimate import estimate
from planner.registry.examples import resolve_model
from planner.search.result import Companions, PlanRequest, plan_argv
from planner.search.search import plan
from planner.synth.gguf_factory import qwen3moe_spec

PLANNER = Path(__file__).resolve().parents[3] / "planner"
TABLE_MODULE = "llama/flags.py"

# Modules of planner/ that may hold a string equal to a spelling of the table, each with the spellings
# it may hold and why. Strings inside f-strings (messages) and the names given to typer.Option/Argument
# (fitplan's own options, several named as llama.cpp names its own) are not spellings written to argv.
EXCEPTIONS: dict[str, tuple[frozenset[str], str]] = {
    "hardware/inventory.py": (frozenset({"--rpc"}), "planner.hardware sits below planner.llama in the "
                              "import layers (rpc_flag: the inventory's endpoints as llama.cpp arguments)"),
    "hardware/budgets.py": (frozenset({"--fit-target"}), "planner.hardware sits below planner.llama in "
                            "the import layers (fit_target_flag)"),
    "hardware/detect.py": (frozenset({"--rpc"}), "planner.hardware sits below planner.llama in the import "
                           "layers (llama-cli --list-devices with the endpoints)"),
    "hardware/local_servers.py": (frozenset({"-t", "--threads"}), "ggml-rpc-server's own -t, read from "
                                  "its command line: another program's option"),
    "hardware/catalog.py": (frozenset({"--device", "--host"}), "names fitplan's --device/--host options "
                            "in error locations"),
    "hardware/inventory_yaml.py": (frozenset({"--device"}), "names fitplan's --device option as a source"),
    "search/companion_plan.py": (frozenset({"--mmproj-device"}), "names fitplan's --mmproj-device option "
                                   "in a message"),
    "api/machine.py": (frozenset({"--device"}), "names fitplan's --device option as an inventory's source"),
    "core/choices.py": (frozenset({"--op-offload", "--split-mode"}), "an enum's own fitplan option name, "
                        "for the one-line error a bad value gets (core sits below planner.llama)"),
    "cli/serve.py": (frozenset({"--device", "--rpc"}), "names fitplan's own options that a set plan ignores"),
    "cli/sd_fit.py": (frozenset({"--device", "--split-mode", "--flash-attn"}),
                      "sd-fit's options, named as sd-cli names its own"),
    "synth/shapes_sd3.py": (frozenset({"-m"}), "sd-cli's -m: the flag each written SD3 file is passed under"),
}
# stable-diffusion.cpp's sd-cli is another program with flags of its own, some spelled as llama.cpp's
# (--flash-attn, --split-mode, -m, -v): planner/sd writes them and is not scanned
OTHER_PROGRAMS = ("sd/",)


def table_spellings() -> frozenset[str]:
    """Every common/arg.cpp spelling in the table, and llama-bench's spellings of those flags (llama-bench's
    own test parameters -p/-n/-d/-r/-o are left out: generic letters other programs use too)."""
    return frozenset(n for f in FLAGS.values() if f.names for n in f.names + f.bench)


def _typer_names(tree: ast.AST) -> set[int]:
    """The nodes given to typer.Option/Argument (or sd-fit's _opt, the CLI's enum `choice`) as option names."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("Option", "Argument", "_opt", "choice"):
                out.update(id(a) for a in node.args)
    return out


def spelled_outside_the_table() -> dict[str, set[str]]:
    names = table_spellings()
    found: dict[str, set[str]] = {}
    for path in sorted(PLANNER.rglob("*.py")):
        rel = path.relative_to(PLANNER).as_posix()
        if rel == TABLE_MODULE or rel.startswith(OTHER_PROGRAMS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _typer_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):   # an f-string's pieces are message text
                skip.update(id(v) for v in node.values)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                    and node.value.strip() in names:
                found.setdefault(rel, set()).add(node.value.strip())
    return found


def test_no_module_but_the_table_spells_a_flag_of_the_table():
    found = spelled_outside_the_table()
    unexplained = {m: sorted(s - EXCEPTIONS.get(m, (frozenset(), ""))[0]) for m, s in found.items()}
    assert {m: s for m, s in unexplained.items() if s} == {}
    # every exception still has something to excuse, and says why
    assert {m: sorted(s) for m, (s, _) in EXCEPTIONS.items() if not s & found.get(m, set())} == {}
    assert all(len(why) > 20 for _, why in EXCEPTIONS.values())


def test_the_scan_sees_a_spelling_written_as_argv(tmp_path, monkeypatch):
    # the scan itself: a module writing ["-ngl", "99"] is found, a message naming -ngl is not
    fake = tmp_path / "planner"
    (fake / "llama").mkdir(parents=True)
    (fake / "writer.py").write_text('ARGV = ["-ngl", "99"]\nMSG = f"-ngl {1}: too many"\n'
                                    'X = typer.Option("--rpc")\n')
    monkeypatch.setitem(globals(), "PLANNER", fake)
    assert spelled_outside_the_table() == {"writer.py": {"-ngl"}}


def test_every_spelling_names_one_flag_and_parses_as_the_table_says():
    common = [n for f in FLAGS.values() for n in f.names]
    assert len(common) == len(set(common))
    for key, flag in FLAGS.items():
        for name in flag.names:
            known = takes_value(name)
            if flag.use is Use.WRITTEN:   # fitplan's own (the model, where llama-server listens): refused in flags
                assert known is None, name
            else:
                assert known is (not flag.switch), (key, name)
        assert flag.programs, key
        assert (Tool.BENCH in flag.programs) == bool(flag.bench)


def test_arg_writes_the_first_spelling_and_bench_arg_llama_benchs():
    assert arg("n_gpu_layers", 99) == ["-ngl", "99"]
    assert arg("kv_unified") == ["-kvu"]
    assert arg("tensor_split", (3.0, 1.5)) == ["-ts", "3,1.5"]
    assert arg("devices", ("RPC0", "RPC1")) == ["-dev", "RPC0,RPC1"]
    assert bench_arg("tensor_split", (3.0, 1.5)) == ["-ts", "3/1.5"]
    assert bench_arg("devices", ("RPC0", "RPC1")) == ["-dev", "RPC0/RPC1"]
    assert bench_arg("rpc", ("a:1", "b:2")) == ["--rpc", "a:1,b:2"]   # not a test parameter in llama-bench
    assert bench_arg("no_op_offload") == ["-nopo", "1"] and bench_arg("no_repack") == ["--repack", "0"]
    with pytest.raises(ValueError):
        arg("kv_unified", 1)
    with pytest.raises(ValueError):
        arg("n_ctx")
    with pytest.raises(ValueError):
        bench_arg("swa_full")   # llama-bench has no such option


def test_to_bench_argv_gives_llama_bench_its_own_forms():
    argv = ["-dev", "RPC0,RPC1", "-ts", "1,2", "--no-op-offload", "-nkvo", "-nr", "--no-host", "-ngl", "99"]
    assert to_bench_argv(argv) == ["-dev", "RPC0/RPC1", "-ts", "1/2", "-nopo", "1", "-nkvo", "1", "--repack", "0",
                                   "--no-host", "1", "-ngl", "99"]


EVERYTHING = LlamaFlags(
    n_ctx=8192, n_batch=1024, n_ubatch=256, n_parallel=2, kv_unified=True, n_gpu_layers=20, split_mode="row",
    tensor_split=(3.0, 1.5), main_gpu=1, devices=("RPC0", "RPC1"), rpc=("127.0.0.1:1", "127.0.0.1:2"),
    override_args=(OverrideArg(OverrideKind.OT, r"blk\.1\.ffn_up=CPU,token_embd=RPC0[127.0.0.1:1]"),
                   OverrideArg(OverrideKind.NCMOE, "3"), OverrideArg(OverrideKind.NCFFN, "1"),
                   OverrideArg(OverrideKind.CMOE)),
    cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on", swa_full=True, kv_offload=False, repack=False,
    no_host=True, op_offload=False, load_mode="mmap",
    spec=SpecFlags(types=("none", "draft-simple", "ngram-simple"), ngram_simple_size_m=12, ngram_map_k_size_m=7,
                   ngram_map_k4v_size_m=9, ngram_mod_n_max=5,
                   draft=DraftFlags(model="d.gguf", n_gpu_layers=-2, devices=("RPC1",), cache_type_k="q8_0",
                                    cache_type_v="q8_0", n_max=5, backend_sampling=False,
                                    override_args=(OverrideArg(OverrideKind.OT, "output=CPU"),
                                                   OverrideArg(OverrideKind.NCMOE, "2"),
                                                   OverrideArg(OverrideKind.CMOE)))),
    mmproj=MmprojFlags(path="p.gguf", device="RPC0", image_min_tokens=64, image_max_tokens=1024),
    loras=(LoraArg("a.gguf"), LoraArg("b.gguf", 0.5)),
    ignored=("-t", "4", "-fit", "off"))


@pytest.mark.parametrize("flags", [LlamaFlags(), EVERYTHING, LlamaFlags(n_gpu_layers=-2, devices=("none",)),
                                   LlamaFlags(mmproj=MmprojFlags(path="p.gguf", use_gpu=False))],
                         ids=["defaults", "every-setting", "ngl-all", "mmproj-on-host"])
def test_every_setting_fitplan_writes_parses_back(flags):
    assert parse_llama_flags(flags_to_argv(flags)) == flags


def _rpc(name: str, port: int, free: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.RPC, Backend.RPC, free, free, 0, 0, 0, endpoint=f"127.0.0.1:{port}")


def _gpu(name: str, free: int) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, free, free, int(900e9), int(50e12), int(25e9))


HOST = HostSpec(64 * GiB, 60 * GiB, int(60e9), "test host", int(1e12))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A few plans as `fitplan plan` makes them: a split over two rpc-servers with an -ot rule, the same
    with a drafter, and an MoE model whose experts do not all fit its card."""
    gemma = model_context(resolve_model("example:gemma3-270m"))
    pair = Inventory((_rpc("RPC0", 50052, 100 * MiB), _rpc("RPC1", 50053, 100 * MiB)), HOST)
    roomy = Inventory((_rpc("RPC0", 50052, 932 * MiB), _rpc("RPC1", 50053, 932 * MiB)), HOST)
    spec = qwen3moe_spec(n_layer=4, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=2,
                         n_ff_exp=512, n_vocab=2048)
    [path] = spec.write(tmp_path_factory.mktemp("moe") / "moe.gguf")
    moe = model_context(str(path))
    card = Inventory((_gpu("CUDA0", 8 * GiB),), HOST)
    everything = estimate(moe, parse_llama_flags(["-dev", "CUDA0", "-c", "4096", "-ngl", "all"]), card)
    experts = sum(t.n_bytes for t in moe.model.tensors if t.name.startswith("blk.0.") and "_exps" in t.name)
    short = everything.device("CUDA0").held_bytes - experts * 3 // 2   # two layers' experts must leave the card
    return {
        "split": plan(gemma, pair, PlanRequest(n_ctx=4096), max_vram="RPC0=100MiB,RPC1=100MiB"),
        "drafter": plan(gemma, roomy, PlanRequest(n_ctx=8192, n_parallel=2,
                                                  companions=Companions(draft=gemma.model.path))),
        "moe": plan(moe, card, PlanRequest(n_ctx=4096, n_ubatch=512, cache_types=("q8_0",)),
                    max_vram=f"CUDA0={short}B"),
    }


@pytest.mark.parametrize("name", ["split", "drafter", "moe"])
def test_a_plans_command_parses_back_to_its_settings(plans, name):
    result = plans[name]
    argv = plan_argv(result)
    assert argv[:2] == arg("model", result.model_path)
    assert parse_llama_flags(argv[2:]) == result.flags


def _from_bench(argv: tuple[str, ...]) -> list[str]:
    """llama-bench's arguments back to llama.cpp's, through the table's llama-bench spellings."""
    by_bench: dict[tuple[str, str], str] = {}
    for key, flag in FLAGS.items():
        if flag.names and flag.bench:
            by_bench[(flag.bench[0], flag.bench_value if flag.switch else "")] = key
    out: list[str] = []
    for name, value in zip(argv[::2], argv[1::2], strict=True):
        if name in ("-m", "-p", "-n", "-d"):
            continue
        key = by_bench.get((name, value)) or by_bench[(name, "")]
        flag = FLAGS[key]
        if flag.switch:
            out += arg(key)
        elif key == "flash_attn":
            out += arg(key, "on" if value == "1" else "off")
        elif key == "n_gpu_layers" and value == BENCH_NGL_ALL:
            continue   # llama-bench has no "auto": more layers than any model has
        elif key == "override_tensor":
            out += arg(key, value.replace(";", ","))
        else:
            out += arg(key, value.replace(flag.bench_sep, ","))
    return out


@pytest.mark.parametrize("name", ["split", "moe"])
def test_a_plans_llama_bench_line_reads_back_to_its_placement(plans, name):
    result = plans[name]
    bench = bench_argv(result.model_path, result.flags, result.n_ctx)
    assert bench.argv is not None
    back = parse_llama_flags(_from_bench(bench.argv))
    f = result.flags
    for field in ("split_mode", "devices", "tensor_split", "rpc", "cache_type_k", "cache_type_v", "n_ubatch",
                  "n_batch", "main_gpu", "kv_offload", "op_offload", "repack", "no_host", "flash_attn"):
        assert getattr(back, field) == getattr(f, field), field
    if f.n_gpu_layers >= 0:
        assert back.n_gpu_layers == f.n_gpu_layers
    # llama-bench appends -ncmoe's rules after every -ot rule; commands.py writes it so only where the
    # order moves no tensor, so the same rules hold
    assert sorted(back.overrides, key=repr) == sorted(f.overrides, key=repr)
