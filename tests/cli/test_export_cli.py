"""`fitplan export`: every export parsed by a real tool — systemd-analyze verify (Debian's systemd),
the compose-spec JSON schema (tests/data/compose-spec.json, compose-spec/compose-spec
schema/compose-spec.json at 170098b), bash -n and the script run against a fake llama-server that
prints its argv (compared byte for byte); the preset read back by the pinned llama-server is in
tests/peer/test_export_peer.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml

from planner.cli import main
from planner.core.errors import BadInput
from planner.emit.document import Deployment, read_deployment
from planner.emit.exports import IMAGE_CPU, IMAGE_CUDA, ExportOptions, export, preset_options
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.flags import parse_llama_flags

RPC0, RPC1 = "127.0.0.1:50001", "127.0.0.1:50002"
GIB = 2**30
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "compose-spec.json").read_text())
# a vector whose values a shell, systemd or YAML would each mangle if quoted wrongly
TRICKY = ("-ot", r"blk\.(3|4)\.ffn_(up|down)_exps=CPU", "-ot", r"token_embd\.weight=CPU", "-c", "4096",
          "-np", "1", "--alias", "it's 100% \"$HOME\"")



@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    """Debian's systemd-analyze, which scripts/test_deps.sh installs: missing, the tests fail (never skip)."""
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is missing: scripts/test_deps.sh installs it (apt-get install systemd)")
    return found


NEEDS_SYSTEMD_ANALYZE = pytest.mark.usefixtures("systemd_analyze")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "plan.yaml"
    assert main(["plan", "example:gemma3-270m", "--device", f"RPC0=1GiB@{RPC0}", "--device", f"RPC1=1GiB@{RPC1}",
                 "--ram", "8GiB", "-c", "2048", "-o", str(path), "--format", "json"]) == 0
    return path


def tricky(model: str = "/models dir/gemma.gguf", cuda: int = 0) -> Deployment:
    devices = tuple(DeviceSpec(f"CUDA{i}", DeviceKind.GPU, Backend.CUDA, 24 * GIB, 24 * GIB, 0, 0, 0)
                    for i in range(cuda))
    return Deployment(model, None, parse_llama_flags(list(TRICKY)), Inventory(devices, HostSpec(GIB, GIB, 0, "")),
                      {}, ("-m", model, *TRICKY))


def _export(capsys, plan: Path, *argv: str) -> str:
    assert main(["export", str(plan), *argv]) == 0
    return capsys.readouterr().out


@NEEDS_SYSTEMD_ANALYZE
@pytest.mark.parametrize("which", ["plan", "tricky"])
def test_systemd_unit_verifies(plan_file, capsys, tmp_path, which):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    (bin_dir / "llama-server").chmod(0o755)
    unit = tmp_path / "fitplan-llama.service"
    if which == "plan":
        unit.write_text(_export(capsys, plan_file, "--to", "systemd", "--llama-bin", str(bin_dir)))
    else:
        unit.write_text(export(tricky(), "systemd", ExportOptions(str(bin_dir / "llama-server"))))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr   # escapes and specifiers all valid
    text = unit.read_text()
    assert "Restart=on-failure" in text and f"ExecStart={bin_dir}/llama-server -m " in text
    if which == "tricky":
        assert r'"blk\\.(3|4)\\.ffn_(up|down)_exps=CPU"' in text and '"it\'s 100%% \\"$$HOME\\""' in text


def test_systemd_needs_an_absolute_program():
    with pytest.raises(BadInput):
        export(tricky(), "systemd", ExportOptions("llama-server"))


def test_compose_matches_the_schema(plan_file, capsys):
    doc = yaml.safe_load(_export(capsys, plan_file, "--to", "compose"))
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    [service] = doc["services"].values()
    assert service["image"] == IMAGE_CPU
    assert service["network_mode"] == "host"   # rpc-servers on the host's loopback
    plan = read_deployment(str(plan_file))
    assert service["volumes"] == [{"type": "bind", "source": plan.model_path, "read_only": True,
                                   "target": "/models/gemma-3-270m-q4_k_m.gguf"}]
    assert service["command"] == ["-m", "/models/gemma-3-270m-q4_k_m.gguf", *plan.flag_argv,
                                  "--host", "127.0.0.1", "--port", "8080"]


def test_compose_of_a_cuda_plan_reserves_its_gpus():
    doc = yaml.safe_load(export(tricky(cuda=2), "compose", ExportOptions(port=9000)))
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    service = doc["services"]["fitplan-llama-server"]
    assert service["image"] == IMAGE_CUDA
    assert service["ports"] == ["127.0.0.1:9000:9000"]
    assert service["command"][:2] == ["-m", "/models/gemma.gguf"]
    assert service["command"][2:] == [*TRICKY, "--host", "0.0.0.0", "--port", "9000"]   # YAML keeps every byte
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]


@pytest.mark.parametrize("which", ["plan", "tricky"])
def test_shell_script_runs_the_vector(plan_file, capsys, tmp_path, which):
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    fake.chmod(0o755)
    script = tmp_path / "serve.sh"
    opts = ExportOptions("llama-server", "127.0.0.1", 8080)
    if which == "plan":
        script.write_text(_export(capsys, plan_file, "--to", "shell", "--llama-bin", str(tmp_path / "nowhere")))
        script.write_text(script.read_text().replace(str(tmp_path / "nowhere" / "llama-server"), "llama-server"))
        argv = list(read_deployment(str(plan_file)).argv)
    else:
        script.write_text(export(tricky(), "shell", opts))
        argv = list(tricky().argv)
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    done = subprocess.run(["bash", str(script), "--extra", "a b"], capture_output=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    expected = [*argv, "--host", "127.0.0.1", "--port", "8080", "--extra", "a b"]
    assert done.stdout == b"".join(a.encode() + b"\0" for a in expected)


def test_preset_options_and_refusals():
    assert preset_options(list(TRICKY)) == [
        ("ot", r"blk\.(3|4)\.ffn_(up|down)_exps=CPU,token_embd\.weight=CPU"), ("c", "4096"), ("np", "1"),
        ("alias", "it's 100% \"$HOME\"")]
    assert preset_options(["-nkvo", "--rpc", RPC0, "--rpc", RPC1, "--host", "x"]) == [
        ("nkvo", "true"), ("rpc", f"{RPC0},{RPC1}")]
    for bad in (["--alias", "a;b"], ["--alias", "x #y"], ["--alias", " x"], ["--no-such"]):
        with pytest.raises(BadInput):
            preset_options(bad)


def test_unknown_target(plan_file, capsys):
    assert main(["export", str(plan_file), "--to", "kubernetes"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@NEEDS_SYSTEMD_ANALYZE
def test_a_lavapipe_plan_carries_the_environment_llama_cpp_needs(tmp_path):
    lavapipe = replace(tricky(), inventory=Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(GIB, GIB, 0, "")))
    (tmp_path / "llama-server").write_text("#!/bin/sh\n")
    (tmp_path / "llama-server").chmod(0o755)
    unit = tmp_path / "lavapipe.service"
    unit.write_text(export(lavapipe, "systemd", ExportOptions(str(tmp_path / "llama-server"))))
    assert "\nEnvironment=GGML_VK_VISIBLE_DEVICES=0\n" in unit.read_text()
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "\nexport GGML_VK_VISIBLE_DEVICES=0\n" in export(lavapipe, "shell")
    assert yaml.safe_load(export(lavapipe, "compose"))["services"]["fitplan-llama-server"]["environment"] == {
        "GGML_VK_VISIBLE_DEVICES": "0"}
    assert export(tricky(cuda=1), "shell").count("export ") == 0   # CUDA: pinned host buffers unless --no-host
