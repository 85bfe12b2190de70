"""The HTML plan report in a real browser: `plan --html` and `fitplan report PLAN.yaml -o` write one
self-contained page; headless Chromium (Debian's `chromium`) renders it, takes a screenshot and dumps
the rendered DOM; the page's text is checked, and a small script added to the page checks that no
element overflows its container (its verdict is written into the DOM, which --dump-dom shows).

In CI the browser must be there (.ci/run installs it): the test skips only outside CI."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from planner.cli import main
from planner.search import whatfits
from planner.synth.shapes_common import write_shape
from tests.support.overhead import cuda

EXAMPLE = ["plan", "example:gemma3-270m", "--devices", "configs/devices/workstation-2x3090.yaml"]
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")

# Every element of the page is checked against its parent's box and its own scroll width; inline
# boxes (no client width) only against their parent. The verdict lands in <pre id="overflow-verdict">.
OVERFLOW_CHECK = """<script>
window.addEventListener("load", () => {
  const bad = [];
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
                       (el.className && typeof el.className === "string" ? "." + el.className : "");
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest("svg") && el.tagName.toLowerCase() !== "svg") continue;
    const parent = el.parentElement, r = el.getBoundingClientRect(), p = parent.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < p.left - 0.5 || r.right > p.right + 0.5) bad.push(name(el) + " outside " + name(parent));
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) bad.push(name(el) + " scrolls");
  }
  if (document.documentElement.scrollWidth > window.innerWidth) bad.push("page wider than the window");
  const out = document.createElement("pre");
  out.id = "overflow-verdict";
  out.textContent = bad.length ? "OVERFLOW: " + bad.join("; ") : "no overflow";
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:   # never a skip: the test command installs it
        pytest.fail("chromium is missing: scripts/test_deps.sh installs it (apt-get install chromium)")
    return found


def browse(chromium: str, page: Path, tmp_path: Path, *action: str, width: int = 1200) -> subprocess.CompletedProcess:
    argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1600",
            "--virtual-time-budget=3000", *action, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def text_of(dom: str) -> str:
    parser = _Text()
    parser.feed(dom)
    return re.sub(r"\s+", " ", " ".join(parser.parts))


def with_check(page: Path, tmp_path: Path) -> Path:
    checked = tmp_path / f"checked-{page.name}"
    checked.write_text(page.read_text(encoding="utf-8").replace("</body>", OVERFLOW_CHECK + "</body>"),
                       encoding="utf-8")
    return checked


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("report")
    cwd = os.getcwd()
    os.chdir(ROOT)   # the inventory path is relative to the repository, as in the README
    try:
        assert main([*EXAMPLE, "--html", str(out / "plan.html"), "-o", str(out / "plan.yaml")]) == 0
        assert main(["report", str(out / "plan.yaml"), "-o", str(out / "report.html")]) == 0
        tiny = ["plan", "example:gemma3-270m", "--device", "CUDA0=1GiB", "--ram", "700MiB", "--max-vram", cuda(100),
                "--max-ram", "300MiB", "--ctx", "32768", "--html", str(out / "infeasible.html")]
        # the page's figures are checked, not the search's time limit: a loaded CI machine must not turn
        # the Host row's search into a flake (as tests/planner/search/test_what_fits.py unhurried)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(whatfits, "SEARCH_SECONDS", 120.0)
            assert main(tiny) == 1
    finally:
        os.chdir(cwd)
    return {p.stem: p for p in out.glob("*.html")}


def test_the_page_is_self_contained(pages):
    for page in pages.values():
        html = page.read_text(encoding="utf-8")
        assert html.startswith("<!DOCTYPE html>")
        assert not re.search(r"""(src|href)\s*=|<link|@import|url\(|https?://""", html), page.name


@pytest.mark.parametrize("name", ["plan", "report"])
@pytest.mark.parametrize("width", [1200, 420])
def test_the_rendered_report_holds_every_part_and_nothing_overflows(chromium, pages, tmp_path, name, width):
    dom = browse(chromium, with_check(pages[name], tmp_path), tmp_path, "--dump-dom", width=width).stdout
    assert '<pre id="overflow-verdict">no overflow</pre>' in dom, re.findall(r"OVERFLOW: [^<]*", dom)
    text = text_of(dom)
    for words in ("Memory per device", "CUDA0", "CUDA1", "Host", "Layer map", "Predicted speeds", "decode",
                  "tokens/s", "Commands", "llama-server -m", "llama-bench -m", "Why (--explain)", "What would fit",
                  "context 32768: ", "left of"):
        assert words in text, words
    if name == "plan":   # the plan file keeps the flags, not how the context was asked for
        assert "context 32768: the model's training context" in text
    assert dom.count('class="cell') == 19   # 18 layers and the output layer
    assert dom.count("<svg") == 3           # one bar per row: CUDA0, CUDA1, Host


def test_plan_html_and_report_from_the_plan_file_agree(chromium, pages, tmp_path):
    # the plan file's flags estimated again give the same figures as the plan itself
    plan_text = text_of(browse(chromium, pages["plan"], tmp_path, "--dump-dom").stdout)
    report_text = text_of(browse(chromium, pages["report"], tmp_path, "--dump-dom").stdout)
    figures = re.compile(r"[\d,]+ MiB")
    assert figures.findall(plan_text) == figures.findall(report_text)


def test_a_screenshot_of_the_report(chromium, pages, tmp_path):
    shot = tmp_path / "report.png"
    browse(chromium, pages["plan"], tmp_path, f"--screenshot={shot}")
    assert png_size(shot) == (1200, 1600)
    assert shot.stat().st_size > 20_000   # a rendered page, not a blank one


def test_the_page_for_a_plan_that_does_not_fit(chromium, pages, tmp_path):
    dom = browse(chromium, with_check(pages["infeasible"], tmp_path), tmp_path, "--dump-dom").stdout
    assert '<pre id="overflow-verdict">no overflow</pre>' in dom, re.findall(r"OVERFLOW: [^<]*", dom)
    text = text_of(dom)
    assert "does not fit" in text and "least budget that plans" in text
    assert "Host at " in text and "MiB fits (--max-ram" in text


def test_report_refuses_what_is_not_a_plan_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {path: x}\n")
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    assert "not a fitplan plan file" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_the_layer_map_of_experts_kept_on_the_host(chromium, tmp_path):
    # a 7.5 GiB card for a 21 GiB MoE: every layer on CUDA0, the routed experts of the first layers in
    # host memory (-ncmoe): those cells are dashed, and the moved tensors are listed by run of layers
    model = write_shape("qwen3moe-30b-a3b", tmp_path)
    page = tmp_path / "moe.html"
    argv = ["plan", str(model), "--device", f"CUDA0={cuda(7680)}", "--ram", "64GiB", "--ctx", "4096", "--html",
            str(page), "--format", "json"]
    assert main(argv) == 0
    dom = browse(chromium, with_check(page, tmp_path), tmp_path, "--dump-dom", width=420).stdout
    assert '<pre id="overflow-verdict">no overflow</pre>' in dom, re.findall(r"OVERFLOW: [^<]*", dom)
    moved = dom.count('class="cell moved"')
    assert 0 < moved < 48
    text = text_of(dom)
    assert f"layers 0-{moved - 1}: ffn_gate_exps.weight, ffn_down_exps.weight, ffn_up_exps.weight on Host" in text
    # what would fit: the training context (40960) on the same budgets, planned
    assert "context up to 40960 fits these budgets (--ctx 40960: decode" in text


@pytest.mark.parametrize("width", [1200, 420])
def test_the_choose_page_holds_a_section_per_candidate_and_nothing_overflows(chromium, tmp_path, width):
    from tests.support.quant_repo import QUANTS, spec

    picked = [q for q in QUANTS if q.tag in ("Q2_K", "Q8_0", "F16")]
    models = [str(spec(q).write(tmp_path / f"Model-{q.tag}.gguf")[0]) for q in picked]
    page = tmp_path / "choose.html"
    assert main(["choose", *models, "--device", f"CUDA0={cuda(640)}", "--ram", "4GiB", "--max-ram", "160MiB",
                 "--ctx", "8192", "--html", str(page)]) == 0
    dom = browse(chromium, with_check(page, tmp_path), tmp_path, "--dump-dom", width=width).stdout
    assert '<pre id="overflow-verdict">no overflow</pre>' in dom, re.findall(r"OVERFLOW: [^<]*", dom)
    text = text_of(dom)
    for words in ("Which file to download", "Candidates", "bits/weight", "does not fit", "highest precision",
                  "fastest", "Memory per device", "Layer map", "llama-server -m"):
        assert words in text, words
    for q in picked:
        assert f"Model-{q.tag}" in text
