"""The argument vectors behind the printed commands: shell quoting that bash undoes exactly, the
llama-server vector (model first, -np stated), and llama-bench's spelling of the same placement
(tools/llama-bench/llama-bench.cpp of the pinned build: ',' starts a test row, '/' separates a
list inside one, ';' separates overrides inside one -ot)."""
from __future__ import annotations

import subprocess

import pytest

from planner.llama.commands import bench_argv, command_line, model_args, server_argv
from planner.llama.flags import parse_llama_flags

EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def bash_words(line: str) -> list[str]:
    done = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("argv", [
    ["-ot", r"blk\.(3|4)\.ffn_(up|down)_exps=CPU"],
    ["-m", "/models/my model's file.gguf", "-c", "4096"],
    ["--alias", "$HOME `id` \"q\" *", "-ot", r"^token_embd\.weight=CPU"],
    ["-ts", "3,1", ""],
])
def test_bash_gives_back_the_vector(argv):
    assert bash_words(command_line("llama-server", argv)) == ["llama-server", *argv]


def test_server_vector_names_the_model_and_the_slots():
    assert server_argv("/m.gguf", ["-c", "4096"], 1) == ["-m", "/m.gguf", "-c", "4096", "-np", "1"]
    assert server_argv("/m.gguf", ["-np", "3"], 1) == ["-m", "/m.gguf", "-np", "3"]
    assert model_args("https://host/m.gguf") == ["-mu", "https://host/m.gguf"]


def flags(*argv: str):
    return parse_llama_flags(list(argv))


def test_bench_puts_every_override_in_one_ot_in_order():
    f = flags("--rpc", "a:1,b:2", "-dev", "RPC0,RPC1", "-ngl", "19", "-ts", "12,7", "-c", "4096",
              "-ot", r"^token_embd\.weight=CPU", "-ot", r"blk\.3\.ffn_down=CPU,blk\.(4|5)\.ffn_up=CPU")
    got = bench_argv("/m.gguf", f, 4096)
    assert got.note == ""
    argv = list(got.argv or ())
    assert argv.count("-ot") == 1
    assert argv[argv.index("-ot") + 1] == r"^token_embd\.weight=CPU;blk\.3\.ffn_down=CPU;blk\.(4|5)\.ffn_up=CPU"
    assert argv[argv.index("-dev") + 1] == "RPC0/RPC1" and argv[argv.index("-ts") + 1] == "12/7"
    assert argv[argv.index("--rpc") + 1] == "a:1,b:2"   # not a test parameter
    # llama-bench sizes a test's context as n_prompt + n_gen + n_depth: the prompt test fills 4096
    assert argv[argv.index("-p") + 1] == "512" and argv[argv.index("-d") + 1] == str(4096 - 512)


def test_bench_keeps_ncmoe_when_the_order_cannot_matter():
    f = flags("-ngl", "99", "-ncmoe", "4", "-ot", r"blk\.9" + EXPS + "=CPU")
    argv = list(bench_argv("/m.gguf", f, 2048).argv or ())
    assert argv[argv.index("-ncmoe") + 1] == "4" and argv[argv.index("-ot") + 1] == r"blk\.9" + EXPS + "=CPU"


def test_bench_spells_ncmoe_out_when_a_later_override_sends_experts_elsewhere():
    # llama.cpp: blk.0/1 experts match -ncmoe first (CPU); llama-bench would try the -ot first (CUDA0)
    f = flags("-ngl", "99", "-ncmoe", "2", "-ot", "exps=CUDA0")
    argv = list(bench_argv("/m.gguf", f, 2048).argv or ())
    assert "-ncmoe" not in argv
    assert argv[argv.index("-ot") + 1] == rf"blk\.0{EXPS}=CPU;blk\.1{EXPS}=CPU;exps=CUDA0"


def test_bench_refuses_a_pattern_it_would_split():
    got = bench_argv("/m.gguf", flags("-ot", "blk;3=CPU"), 2048)
    assert got.argv is None and "blk;3=CPU" in got.note and "';'" in got.note


def test_bench_says_what_it_does_not_measure():
    got = bench_argv("/m.gguf", flags("-np", "4", "-c", "8192"), 8192)
    assert got.argv is not None and "-np" in got.note
