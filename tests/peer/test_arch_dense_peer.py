"""The llama-like dense architectures (planner/synth/shapes_dense.py) against the pinned llama-fit-params:
one shape-faithful file of a published model per architecture, over tests/support/arch_matrix's rows
(host only, two and three rpc-servers, partial offload, -fa off at 32k, q8_0 caches, -np 4) and -sm
tensor, plus an OLMo-3-shaped olmo2 file whose sliding window makes its cache iSWA. Model
and context equal llama.cpp's to the MiB; the compute is the runtime's simulation, within 3 % or
4 MiB and never more than 1 MiB below.
"""
from __future__ import annotations

import pytest

from planner.synth import shapes_dense
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, shape_file

pytestmark = pytest.mark.peer

# -sm tensor over two rpc-servers: one Meta() row (llama.cpp refuses it for olmo2)
SM_TENSOR = ("{rpc2} -c 4096 -sm tensor",)

SHAPES: dict[str, ArchShape] = {
    "mistral3-24b": ArchShape("mistral3-24b", shapes_dense.mistral3_24b, 40, extra=SM_TENSOR),
    "seed-oss-36b": ArchShape("seed-oss-36b", shapes_dense.seed_oss_36b, 64, extra=SM_TENSOR),
    "ernie4_5-0.3b": ArchShape("ernie4_5-0.3b", shapes_dense.ernie4_5_0p3b, 18, extra=SM_TENSOR),
    "internlm2-7b": ArchShape("internlm2-7b", shapes_dense.internlm2_7b, 32, extra=SM_TENSOR),
    "smollm3-3b": ArchShape("smollm3-3b", shapes_dense.smollm3_3b, 36, extra=SM_TENSOR),
    "granite-8b": ArchShape("granite-8b", shapes_dense.granite_8b, 40, extra=SM_TENSOR),
    "arcee-4.5b": ArchShape("arcee-4.5b", shapes_dense.arcee_4p5b, 36, extra=SM_TENSOR),
    "apertus-8b": ArchShape("apertus-8b", shapes_dense.apertus_8b, 32, extra=SM_TENSOR),
    "olmo2-7b": ArchShape("olmo2-7b", shapes_dense.olmo2_7b, 32),
    "exaone4-32b": ArchShape("exaone4-32b", shapes_dense.exaone4_32b, 64, extra=SM_TENSOR),
    "hunyuan-dense-7b": ArchShape("hunyuan-dense-7b", shapes_dense.hunyuan_7b, 32, extra=SM_TENSOR),
    "glm4-9b": ArchShape("glm4-9b", shapes_dense.glm4_9b, 40, extra=SM_TENSOR),
}
ROWS = arch_rows(SHAPES)


@pytest.mark.parametrize("name, template", ROWS, ids=[f"{n}: {t}" for n, t in ROWS])
def test_dense_arch_matches_fit_print(llama_tools, rpc_three, shapes_dir, shape_files, name, template):
    path, ctx = shape_file(shape_files, shapes_dir, SHAPES[name])
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)


OLMO3 = ArchShape("olmo3-7b", shapes_dense.olmo3_7b, 32)


@pytest.mark.parametrize("template", ["-c 4096", "{rpc2} -c 32768 -ts 3,1 -fa off", "{rpc2} -c 8192 -ts 1,1 -np 4"])
def test_olmo2_with_a_sliding_window_matches_fit_print(llama_tools, rpc_three, shapes_dir, shape_files, template):
    path, ctx = shape_file(shape_files, shapes_dir, OLMO3)
    check_row(llama_tools, path, ctx, OLMO3, template, rpc_three)
