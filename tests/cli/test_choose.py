"""`fitplan choose`: a repository's quantizations ranked for one inventory, from headers alone.

The repository (tests/support/quant_repo.py: twelve quantizations, two split into shards, an mmproj)
is served by the loopback Hub fake (tests/support/fake_hub.py); every figure the tests expect comes
from `fitplan plan` run on each file alone, or from the quantizations' definitions.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.gguf.reader import read_model
from planner.gguf.source import INITIAL_CHUNK
from planner.system import net
from tests.support.fake_hub import MODEL_MEDIA_TYPE, Hosts, OllamaLayer, hosted, settle
from tests.support.http_server import Reply
from tests.support.overhead import cuda
from tests.support.quant_repo import MMPROJ, QUANTS, bits_per_weight, repo_path, spec, write_repo

REPO = "org/Model-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# a 640 MiB device (128 MiB after the default 512 MiB margin) and 160 MiB of host budget: the small
# files run on the device, the middle ones spill to the host, F16 and BF16 fit nowhere at 8k
BOX = ["--device", f"CUDA0={cuda(640)}", "--ram", "4GiB", "--max-ram", "160MiB", "--ctx", "8192"]
ROOMY = ["--device", f"CUDA0={cuda(4096)}", "--ram", "16GiB"]


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory) -> dict[str, Path]:
    return write_repo(tmp_path_factory.mktemp("quant-repo"))


@pytest.fixture
def hosts(net_sandbox, http_servers, tmp_path, monkeypatch) -> Iterator[Hosts]:
    with hosted(http_servers, tmp_path, monkeypatch) as h:
        yield h


@pytest.fixture
def served(hosts, repo_files) -> Hosts:
    hosts.hf.add(REPO, repo_files, commit=COMMIT)
    return hosts


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def choose_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "choose", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def url(hosts: Hosts, path: str) -> str:
    return f"{hosts.hf.endpoint}/{REPO}/resolve/{COMMIT}/{path}"


def test_the_table_lists_every_quantization_once_and_reads_headers_only(served, capsys, repo_files):
    code, out, err = run(capsys, "choose", f"hf://{REPO}", *BOX)
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("file "))
    rows = lines[head + 2: head + 2 + len(QUANTS)]
    assert [r.split()[0] for r in rows] == [q.tag for q in QUANTS]     # the shards grouped: one row each
    for q, r in zip(QUANTS, rows, strict=True):
        assert f"{bits_per_weight(q):.2f}" in r.split()
    assert f"  {MMPROJ}" in out and "projectors" in out
    assert "highest precision that fits: " in out and "fastest: " in out
    assert "llama-server -mu " in out           # the recommended file's plan, as `plan` prints it
    # each file's header read by Range: at most one 256 KiB chunk past it, never the tensor data
    server = settle(served.hf.server)
    for path, file in repo_files.items():
        if not path.endswith(".gguf") or path == MMPROJ:
            assert server.requests(f"/{REPO}/resolve/{COMMIT}/{path}") == 0, path
            continue
        header = read_model(file).header_bytes if "-0000" not in path else _shard_header(file)
        read = server.body_bytes(f"/{REPO}/resolve/{COMMIT}/{path}")
        assert 0 < read <= header + INITIAL_CHUNK, (path, read, header)


def _shard_header(file: Path) -> int:
    from planner.gguf.reader import read_header_bytes

    return len(read_header_bytes(str(file)).data)


def where_it_runs(plan: dict) -> str:
    """From a plan document's device rows: layers (the output layer too) and experts on devices only,
    on the host only, or on both."""
    def holds(row: dict) -> bool:
        return bool(row["layers"] or row["output_layer"])

    host_rows = ("Host", "CPU_REPACK")
    on_devices = any(holds(r) for r in plan["devices"] if r["name"] not in host_rows)
    on_host = any(holds(r) for r in plan["devices"] if r["name"] in host_rows) or plan["experts_on_host"]
    return "host" if not on_devices else "devices + host" if on_host else "devices"


def test_the_recommendation_is_the_best_of_the_plans_made_one_by_one(served, capsys):
    doc = choose_json(capsys, f"hf://{REPO}", *BOX)
    alone = {}
    for q in QUANTS:
        code, out, err = run(capsys, "plan", url(served, repo_path(q)), *BOX, "--format", "json")
        alone[q.tag] = json.loads(out) if code == 0 else None
        assert code in (0, 1), err
    fits = [q for q in QUANTS if alone[q.tag] is not None]
    assert 0 < len(fits) < len(QUANTS)          # the budgets rule some out
    precise = max(fits, key=lambda q: (round(bits_per_weight(q), 3), alone[q.tag]["predicted"]["decode_tokens_s"]))
    fastest = max(fits, key=lambda q: (alone[q.tag]["predicted"]["decode_tokens_s"], round(bits_per_weight(q), 3)))
    assert doc["recommended"]["highest_precision"]["label"] == precise.tag
    assert doc["recommended"]["fastest"]["label"] == fastest.tag
    assert doc["plan"]["argv"] == alone[precise.tag]["argv"]
    by_label = {c["label"]: c for c in doc["candidates"]}
    for q in QUANTS:
        row, plan = by_label[q.tag], alone[q.tag]
        assert row["fits"] is (plan is not None)
        if plan is not None:
            assert row["runs_on"] == where_it_runs(plan), q.tag
            assert row["flags"] == plan["flags"]
            assert row["decode_tokens_s"] == plan["predicted"]["decode_tokens_s"]
            assert row["prefill_tokens_s"] == plan["predicted"]["prefill_tokens_s"]


def test_a_second_run_is_answered_by_the_header_cache(served, capsys):
    first = choose_json(capsys, f"hf://{REPO}", *BOX)
    server = settle(served.hf.server)
    server.reset()
    assert choose_json(capsys, f"hf://{REPO}", *BOX) == first
    resolves = [r for r in settle(server).records() if "/resolve/" in r.path]
    assert resolves and {r.status for r in resolves} == {304}
    assert sum(r.body_bytes for r in resolves) == 0


def test_split_models_are_one_candidate_of_all_their_shards(served, capsys):
    doc = choose_json(capsys, f"hf://{REPO}", *ROOMY, "--include", "*F16")
    assert [c["label"] for c in doc["candidates"]] == ["F16", "BF16"]
    for c, q in zip(doc["candidates"], [q for q in QUANTS if q.shards > 1], strict=True):
        assert c["files"] == [repo_path(q, i) for i in range(1, q.shards + 1)]
        assert c["n_params"] == doc["candidates"][0]["n_params"]


def test_mmproj_auto_plans_each_file_with_the_repositorys_projector(served, capsys):
    doc = choose_json(capsys, f"hf://{REPO}", *ROOMY, "--include", "Q4_K_M",
                      "--include", "Q8_0", "--mmproj", "auto")
    assert doc["projectors"] == [{"model": f"hf://{REPO}", "path": MMPROJ, "location": url(served, MMPROJ)}]
    for c in doc["candidates"]:
        assert c["mmproj"] == url(served, MMPROJ)
    assert [x["model"] for x in doc["plan"]["companions"]] == [url(served, MMPROJ)]
    argv = doc["plan"]["argv"]
    assert argv[argv.index(url(served, MMPROJ)) - 1] in ("-mm", "-mmu")


def test_yaml_and_html_outputs(served, capsys, tmp_path):
    page = tmp_path / "choice.html"
    code, out, err = run(capsys, "choose", f"hf://{REPO}", *BOX, "--format", "yaml", "--html", str(page),
                         "-o", str(tmp_path / "plan.yaml"))
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert len(doc["candidates"]) == len(QUANTS)
    html = page.read_text()
    for i, q in enumerate(QUANTS):
        assert f'<section id="candidate-{i}"><h2>{q.tag}' in html
    assert 'id="memory"' in html and 'id="layers"' in html
    deployment = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert deployment["argv"] == doc["plan"]["argv"]


def test_several_models_are_compared_in_one_table(served, capsys, repo_files):
    local = str(repo_files[repo_path(QUANTS[0])])
    doc = choose_json(capsys, f"hf://{REPO}:Q4_K_M", local, *BOX)
    assert doc["sources"] == [f"hf://{REPO}:Q4_K_M", local]
    assert [c["model"] for c in doc["candidates"]] == doc["sources"]
    code, out, _ = run(capsys, "choose", f"hf://{REPO}:Q4_K_M", local, *BOX)
    assert code == 0 and out.splitlines()[2].startswith("model ")


def test_a_modelscope_repository_is_listed_the_same_way(hosts, capsys, repo_files):
    picked = {p: f for p, f in repo_files.items() if "Q4_K_M" in p or "BF16" in p or p == MMPROJ}
    hosts.ms.add(REPO, picked)
    doc = choose_json(capsys, f"ms://{REPO}", *ROOMY)
    assert [c["label"] for c in doc["candidates"]] == ["Q4_K_M", "BF16"]
    assert doc["candidates"][1]["files"] == [repo_path(QUANTS[-1], i) for i in (1, 2, 3)]
    assert [p["path"] for p in doc["projectors"]] == [MMPROJ]
    assert doc["recommended"]["highest_precision"]["label"] == "BF16"


def test_a_file_that_is_no_model_is_a_row_that_says_so(hosts, capsys, repo_files):
    broken = hosts.files / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))        # version 0: not a GGUF llama.cpp reads
    hosts.hf.add("org/mixed-GGUF", {"Model-Q4_K_M.gguf": repo_files["Model-Q4_K_M.gguf"],
                                    "Model-Q8_0.gguf": broken}, commit=COMMIT)
    code, out, err = run(capsys, "choose", "hf://org/mixed-GGUF", *ROOMY)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("Q8_0 "))
    assert row.split()[1:4] == ["-", "-", "-"] and "cannot plan" in row
    assert "highest precision that fits: Q4_K_M" in out
    doc = choose_json(capsys, "hf://org/mixed-GGUF", *ROOMY)
    assert doc["candidates"][1]["problem"].startswith("cannot plan: ")


# --- Ollama: every tag of a model from the registry fake -----------------------------------------

def test_an_ollama_models_tags_are_compared(hosts, capsys, repo_files):
    tags = {"8b-q4_K_M": "Q4_K_M", "8b-q8_0": "Q8_0", "8b-q2_K": "Q2_K"}
    for tag, quant in tags.items():
        hosts.ollama.add("model", tag, [OllamaLayer(MODEL_MEDIA_TYPE, repo_files[f"Model-{quant}.gguf"])])
    doc = choose_json(capsys, "ollama://model", *BOX)
    assert sorted(c["label"] for c in doc["candidates"]) == sorted(tags)
    assert {c["file_type"] for c in doc["candidates"]} == set(tags.values())
    server = settle(hosts.ollama.server)
    for c in doc["candidates"]:     # each blob's header read once, by Range
        blob = c["location"].removeprefix(hosts.ollama.endpoint)
        header = read_model(repo_files[f"Model-{tags[c['label']]}.gguf"]).header_bytes
        assert 0 < server.body_bytes(blob) <= header + INITIAL_CHUNK
    assert server.requests("/v2/library/model/tags/list") == 1
    # a second run: every blob's header from the header cache, each request answered 304 without a body
    server.reset()
    assert choose_json(capsys, "ollama://model", *BOX) == doc
    blobs = [r for r in settle(server).records() if "/blobs/" in r.path]
    assert len(blobs) == len(tags) and {r.status for r in blobs} == {304} and sum(r.body_bytes for r in blobs) == 0
    alone = {}
    for tag in tags:
        code, out, err = run(capsys, "plan", f"ollama://model:{tag}", *BOX, "--format", "json")
        assert code == 0, err
        alone[tag] = json.loads(out)
    fastest = max(tags, key=lambda t: alone[t]["predicted"]["decode_tokens_s"])
    assert doc["recommended"]["fastest"]["label"] == fastest
    assert doc["recommended"]["highest_precision"]["label"] == "8b-q8_0"
    assert doc["plan"]["argv"] == alone["8b-q8_0"]["argv"]


def test_pulled_tags_count_when_the_registry_lists_none(hosts, capsys, tmp_path):
    from tests.support.fake_hub import write_ollama_store

    quants = {q.tag: q for q in QUANTS}
    for tag, quant in (("small", "Q2_K"), ("big", "Q8_0")):
        [blob] = spec(quants[quant]).write(tmp_path / f"{tag}.gguf")     # moved into the store
        write_ollama_store(hosts.settings.ollama_models, "pulled", tag, [OllamaLayer(MODEL_MEDIA_TYPE, blob)])
    doc = choose_json(capsys, "ollama://pulled", *ROOMY)
    assert [c["label"] for c in doc["candidates"]] == ["big", "small"]
    assert doc["recommended"]["highest_precision"]["label"] == "big"
    assert settle(hosts.ollama.server).requests() == 1      # the tag list only: the blobs are local


# --- errors: one line, exit 2, nothing written -----------------------------------------------------

def one_line(capsys, tmp_path, *argv: str) -> str:
    page = tmp_path / "never.html"
    code, out, err = run(capsys, "choose", *argv, "--html", str(page))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fitplan: error: "), (code, err)
    assert not page.exists() and out == ""
    return lines[0]


def test_a_repository_without_gguf_files(hosts, capsys, tmp_path):
    readme = hosts.files / "README.md"
    readme.write_text("hi")
    hosts.hf.add("org/safetensors-only", {"README.md": readme, "model.safetensors": readme}, commit=COMMIT)
    assert "holds no GGUF file" in one_line(capsys, tmp_path, "hf://org/safetensors-only", *BOX)


def test_a_gated_repository_without_a_token(hosts, capsys, tmp_path, repo_files):
    hosts.hf.add("org/gated-GGUF", repo_files, commit=COMMIT, gated=True)
    assert "gated repository" in one_line(capsys, tmp_path, "hf://org/gated-GGUF", *BOX)


def test_an_unknown_repository(hosts, capsys, tmp_path):
    assert "no repository org/missing" in one_line(capsys, tmp_path, "hf://org/missing", *BOX)


def test_an_unknown_ollama_model(hosts, capsys, tmp_path):
    assert "no such Ollama model" in one_line(capsys, tmp_path, "ollama://nothing", *BOX)


def test_hundreds_of_files_are_refused_with_how_to_narrow(hosts, capsys, tmp_path, repo_files):
    one = repo_files[repo_path(QUANTS[0])]
    hosts.hf.add("org/huge-GGUF", {f"exp{i:03d}/m-Q4_K_M.gguf": one for i in range(300)}, commit=COMMIT)
    line = one_line(capsys, tmp_path, "hf://org/huge-GGUF", *BOX)
    assert "300 models" in line and "--include" in line and "--max-files" in line
    assert settle(hosts.hf.server).requests() == 1       # the listing only: no header was read


def _rate_limited(hosts: Hosts, after: str, times: int) -> list[int]:
    """The listing answers 429 with Retry-After `after` `times` times, then as the Hub does."""
    answered: list[int] = []
    api = f"/api/models/{REPO}"

    def limited(req):
        if len(answered) < times:
            answered.append(429)
            return Reply(429, b'{"error": "rate limited"}', {"Retry-After": after, "Content-Type": "application/json"})
        answered.append(200)
        return hosts.hf._api(req)

    hosts.hf.server.mount(api, limited, prefix=True, protected=False)
    return answered


@contextmanager
def retries(n: int) -> Iterator[None]:
    with net.use(replace(net.current(), retries=n)):
        yield


def test_a_rate_limit_is_waited_out_as_retry_after_asks(served, capsys):
    answered = _rate_limited(served, "1", times=1)
    started = time.monotonic()
    with retries(2):
        doc = choose_json(capsys, f"hf://{REPO}", *BOX, "--include", "Q4_K_M")
    assert answered == [429, 200] and time.monotonic() - started >= 1.0
    assert [c["label"] for c in doc["candidates"]] == ["Q4_K_M"]


def test_a_rate_limit_asking_too_long_is_one_line_at_once(served, capsys, tmp_path):
    answered = _rate_limited(served, "3600", times=5)
    started = time.monotonic()
    with retries(2):
        line = one_line(capsys, tmp_path, f"hf://{REPO}", *BOX)
    assert "HTTP 429" in line and "3600 s" in line and "try again later" in line
    assert answered == [429] and time.monotonic() - started < 5


def test_a_rate_limit_that_lasts_is_one_line(served, capsys, tmp_path):
    answered = _rate_limited(served, "0", times=5)
    with retries(1):
        line = one_line(capsys, tmp_path, f"hf://{REPO}", *BOX)
    assert "HTTP 429" in line and "2 time(s)" in line and answered == [429, 429]


def test_a_rate_limited_file_keeps_what_the_cache_holds(served, capsys, tmp_path):
    """A header read refused by a long rate limit fails the whole command (nothing written), and the
    headers read before it stay cached: the next run asks for them conditionally."""
    choose_json(capsys, f"hf://{REPO}", *BOX, "--include", "Q2_K")
    path = f"/{REPO}/resolve/{COMMIT}/{repo_path(QUANTS[-1], 1)}"
    served.hf.server.mount(path, lambda req: Reply(429, b"slow down", {"Retry-After": "600"}), protected=False)
    line = one_line(capsys, tmp_path, f"hf://{REPO}", *BOX, "-o", str(tmp_path / "never.yaml"))
    assert "HTTP 429" in line and not (tmp_path / "never.yaml").exists()
    settle(served.hf.server).reset()
    choose_json(capsys, f"hf://{REPO}", *BOX, "--include", "Q2_K")
    q2 = [r for r in settle(served.hf.server).records() if r.path.endswith(repo_path(QUANTS[0]))]
    assert q2 and {r.status for r in q2} == {304}


@pytest.mark.parametrize("argv, fragment", [
    (["--format", "csv"], "--format 'csv'"),
    (["--clients", "0"], "--clients"),
    (["--split-mode", "row"], "--split-mode"),
    (["--max-files", "0"], "--max-files"),
])
def test_bad_options_are_one_line(capsys, tmp_path, argv, fragment, net_sandbox):
    assert fragment in one_line(capsys, tmp_path, "hf://org/x", *BOX, *argv)
