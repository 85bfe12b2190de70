"""validate refuses, in one line and with exit 1, a run whose resident needs exceed this machine's
MemAvailable, before allocating (issue #22 deliverable 1)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import Keys

from planner.checking.resident import BASELINE_BYTES, check_resident
from planner.core.errors import InfeasiblePlacement
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.estimate import estimate_settings
from planner.synth.gguf_factory import add_tokenizer, llama_spec
from planner.synth.shapes_common import write_shape
from planner.synth.tiny_models import write_random
from runtime.ggml.dequant import mem_available

REPO = Path(__file__).resolve().parents[2]
# Llama-3.1-8B-class KV per cell: 32 layers x (K + V) x 1024 (8 heads of 128) x 2 bytes (f16)
KV_BYTES_PER_CELL = 32 * 2 * 1024 * 2


@pytest.mark.skipif(mem_available() is None, reason="no /proc/meminfo MemAvailable")
def test_kv_past_mem_available_is_refused_in_one_line_before_allocating(tmp_path):
    model = write_shape("llama-8b", tmp_path)          # a sparse file: 4.8 GiB apparent, a few MiB on disk
    avail = mem_available()
    assert avail is not None
    n_ctx = 256
    while n_ctx * KV_BYTES_PER_CELL < 2 * avail:          # the KV alone twice what this machine has free
        n_ctx *= 2
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner.cli", "validate", str(model), "--prompt-tokens", "8",
                           "--gen-tokens", "2", "--", "-c", str(n_ctx)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    seconds = time.perf_counter() - t0
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "this machine cannot hold what validate needs" in lines[0]
    kv_gib = n_ctx * KV_BYTES_PER_CELL / 2**30
    assert f"KV {kv_gib:.2f} GiB" in lines[0]               # the figures: KV as derived above
    assert "MemAvailable" in lines[0]
    assert done.stdout == ""
    assert seconds < 30                                       # refused from the header, nothing allocated


def test_resident_needs_count_kv_compute_cache_and_working_set_not_mapped_weights(tmp_path):
    model = read_model(str(write_shape("llama-8b", tmp_path)))
    settings = resolve_settings(model_context(model), parse_llama_flags(["-c", "4096"]), None)
    est = estimate_settings(settings)
    need = check_resident(model, est, available=1 << 50)
    assert need.kv_bytes == 4096 * KV_BYTES_PER_CELL
    assert need.total == need.kv_bytes + need.compute_bytes + need.cache_bytes + need.working_bytes + BASELINE_BYTES
    assert need.mapped_bytes > 4 << 30                        # 4.8 GiB of weights, none of it in `total`
    with pytest.raises(InfeasiblePlacement) as e:
        check_resident(model, est, available=need.total - 1)
    assert e.value.exit_code == 1 and "\n" not in str(e.value)


def test_an_address_space_limit_is_checked_with_the_weights_map(tmp_path):
    """Under `ulimit -v` the weights' map counts too: it takes address space though it is evictable."""
    model = read_model(str(write_shape("llama-8b", tmp_path)))
    est = estimate_settings(resolve_settings(model_context(model), parse_llama_flags(["-c", "512"]), None))
    need = check_resident(model, est, available=1 << 50, address_space=1 << 50)
    with pytest.raises(InfeasiblePlacement) as e:
        check_resident(model, est, available=1 << 50, address_space=need.total + need.mapped_bytes - 1)
    assert "address-space limit (ulimit -v)" in str(e.value) and "\n" not in str(e.value)


def _limit_address_space() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))   # 1.5 GiB


def test_validate_under_ulimit_v_refuses_in_one_line_instead_of_a_memory_error(tmp_path):
    """A KV of 4M cells (2 GiB) fits this machine's RAM but not a 1.5 GiB address-space limit: exit 1 in one
    line (the fuzz harness found numpy's MemoryError here: a 1M-cell KV against its 1 GiB limit)."""
    spec = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2)   # K + V: 2 layers x 2 x 64 x 2 bytes a cell
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = 1 << 22
    add_tokenizer(spec, 1000)
    model = write_random(tmp_path / "long.gguf", spec, all_f32=True)
    done = subprocess.run([sys.executable, "-m", "planner.cli", "validate", str(model), "--prompt-tokens", "8",
                           "--gen-tokens", "2", "--", "-c", str(1 << 22)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
                          preexec_fn=_limit_address_space)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "address-space limit (ulimit -v)" in lines[0], done.stderr
    assert "KV 2.00 GiB" in lines[0]
