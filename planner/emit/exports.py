"""A plan as something that runs it: a systemd unit, a docker compose service, a llama.cpp preset,
or a shell script (`fitplan export PLAN.yaml --to ...`). Each is text made from the plan's
argument vector (Deployment.argv), never from its `flags` string.

- systemd: ExecStart quotes every argument that needs it the way systemd.syntax(7) reads it (double
  quotes, C escapes, `%%` for a literal `%` — specifiers are expanded first — and `$$` for `$`).
- compose: the official llama.cpp server image (its entrypoint is llama-server, so `command` is
  the arguments), the model bind-mounted read-only, GPU reservations for a CUDA plan's devices.
- preset: the INI format of the pinned llama-server's `--models-preset` (common/preset.cpp): one
  section per model, keys are option names without dashes, a switch is `key = true`. Its parser
  ends a value at `;` or `#` and trims blanks, so a value holding those cannot be written.
- shell: a bash script that execs llama-server with the argument vector (shlex-quoted).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath

import yaml

from planner.core.errors import BadInput
from planner.emit.document import Deployment
from planner.hardware.inventory import Backend
from planner.hardware.vulkan_devices import LAVAPIPE
from planner.llama.commands import LLAMA_SERVER
from planner.llama.flags import FLAGS, arg, flag_key, takes_value
from planner.system.llama_tools import LLAMA_CPP_PIN, VULKAN_ENV


class Target(str, Enum):
    SYSTEMD = "systemd"
    COMPOSE = "compose"
    PRESET = "preset"
    SHELL = "shell"


# ggml-org's published server images (llama.cpp .devops/, docs/docker.md)
IMAGE_CUDA = "ghcr.io/ggml-org/llama.cpp:server-cuda"
IMAGE_CPU = "ghcr.io/ggml-org/llama.cpp:server"
CONTAINER_MODELS = "/models"
DEFAULT_PORT = 8080


@dataclass(frozen=True)
class ExportOptions:
    program: str = LLAMA_SERVER       # llama-server's path (systemd needs an absolute one)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    name: str = "fitplan-llama-server"


def environment(dep: Deployment) -> dict[str, str]:
    """What the process environment must hold for llama.cpp to see the plan's devices: Mesa's
    lavapipe is listed only once GGML_VK_VISIBLE_DEVICES names it (planner.system.llama_tools)."""
    env: dict[str, str] = {}
    for dev in dep.inventory.devices if dep.inventory else ():
        if dev.backend is Backend.VULKAN and LAVAPIPE.match in dev.description:
            env.update(VULKAN_ENV)
    return env


def server_args(dep: Deployment, opts: ExportOptions) -> list[str]:
    """llama-server's arguments: the plan's vector, then where it listens."""
    return [*dep.argv, *arg("host", opts.host), *arg("port", opts.port)]


# --- systemd ------------------------------------------------------------------------------------

_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_./:,=+@-]+$")
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def systemd_word(arg: str) -> str:
    """One ExecStart argument as systemd reads it back (systemd.syntax(7) "Quoting")."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_PLAIN.match(arg):
        return arg
    return '"' + "".join(_SYSTEMD_ESCAPES.get(c, c) for c in arg) + '"'


def systemd_unit(dep: Deployment, opts: ExportOptions) -> str:
    if not opts.program.startswith("/"):
        raise BadInput(f"--to systemd: ExecStart needs llama-server's absolute path, got {opts.program!r} "
                       "(give --llama-bin DIR)")
    lines = ["[Unit]", f"Description=llama-server for {PurePosixPath(dep.model_path).name} (fitplan plan, "
             f"{LLAMA_CPP_PIN})", "After=network-online.target", "Wants=network-online.target", "",
             "[Service]", "Type=simple"]
    lines += [f"Environment={systemd_word(f'{k}={v}')}" for k, v in environment(dep).items()]
    lines += ["ExecStart=" + " ".join(systemd_word(a) for a in [opts.program, *server_args(dep, opts)]),
              "Restart=on-failure", "RestartSec=5", "", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


# --- docker compose -----------------------------------------------------------------------------

def _loopback_rpc(dep: Deployment) -> bool:
    return any(ep.split(":")[0] in ("127.0.0.1", "localhost") for ep in dep.flags.rpc)


def compose_service(dep: Deployment, opts: ExportOptions) -> str:
    """A compose file with one service; a plan over rpc-servers on loopback shares the host's
    network (the container's loopback is not the host's), any other publishes the port."""
    cuda = [d for d in (dep.inventory.devices if dep.inventory else ()) if d.backend is Backend.CUDA]
    host_net = _loopback_rpc(dep)
    args = server_args(dep, ExportOptions(opts.program, opts.host if host_net else "0.0.0.0", opts.port, opts.name))
    service: dict = {"image": IMAGE_CUDA if cuda else IMAGE_CPU}
    if args and flag_key(args[0]) == "model":
        args[1] = f"{CONTAINER_MODELS}/{PurePosixPath(dep.model_path).name}"
        service["volumes"] = [{"type": "bind", "source": dep.model_path, "target": args[1], "read_only": True}]
    service["command"] = args
    if host_net:
        service["network_mode"] = "host"
    else:
        service["ports"] = [f"{opts.host}:{opts.port}:{opts.port}"]
    if environment(dep):
        service["environment"] = environment(dep)
    if cuda:
        ids = [d.name.removeprefix("CUDA") for d in cuda]
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": ids, "capabilities": ["gpu"]}]}}}
    service["restart"] = "unless-stopped"
    return yaml.safe_dump({"services": {opts.name: service}}, sort_keys=False)


# --- llama.cpp preset ---------------------------------------------------------------------------

_PRESET_JOINED = {name: "," for key in ("override_tensor", "rpc") for name in FLAGS[key].names}   # llama.cpp appends
_PRESET_SKIP = {*FLAGS["host"].names, *FLAGS["port"].names}   # the router sets its children's (update_args)


def preset_value(key: str, value: str) -> str:
    # common/preset.cpp parse_ini_from_file: a value ends at ws* followed by ';', '#' or a newline
    if any(c in value for c in ";#\n\r") or value != value.strip(" \t") or not value:
        raise BadInput(f"--to preset: {key} = {value!r} cannot be written in llama.cpp's INI presets "
                       "(a value ends at ';' or '#' and loses surrounding blanks)")
    return value


def preset_options(argv: list[str]) -> list[tuple[str, str]]:
    """(key, value) pairs in command-line order; repeated -ot/--rpc joined as llama.cpp appends them,
    another repeated option keeps its last value (as on the command line)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        name, value = argv[i], "true"
        valued = takes_value(name)
        if valued is None:
            raise BadInput(f"--to preset: {name} is not an option fitplan knows the form of")
        if valued:
            value = argv[i + 1]
            i += 1
        i += 1
        if name in _PRESET_SKIP:
            continue
        key = name.lstrip("-")
        if name in _PRESET_JOINED and key in out:
            value = out[key] + _PRESET_JOINED[name] + value
        out[key] = preset_value(key, value)
    return list(out.items())


def preset_file(dep: Deployment, opts: ExportOptions) -> str:
    model_key = "model-url" if dep.argv and flag_key(dep.argv[0]) == "model_url" else "model"
    section = PurePosixPath(dep.model_path).stem
    lines = [f"; llama-server --models-preset THIS_FILE --host {opts.host} --port {opts.port}",
             f"; from a fitplan plan ({LLAMA_CPP_PIN})", f"[{section}]",
             f"{model_key} = {preset_value(model_key, dep.model_path)}"]
    lines += [f"{k} = {v}" for k, v in preset_options(list(dep.flag_argv))]
    lines.append("load-on-startup = true")   # a preset-only option (common_params_add_preset_options)
    return "\n".join(lines) + "\n"


# --- shell --------------------------------------------------------------------------------------

def shell_script(dep: Deployment, opts: ExportOptions) -> str:
    exports = [f"export {k}={shlex.quote(v)}" for k, v in environment(dep).items()]
    program = shlex.quote(opts.program)
    return "\n".join(["#!/usr/bin/env bash",
                      f"# llama-server for {PurePosixPath(dep.model_path).name}, from a fitplan plan ({LLAMA_CPP_PIN})",
                      "# extra arguments are passed on to llama-server", "set -euo pipefail", *exports,
                      f'exec {program} {shlex.join(server_args(dep, opts))} "$@"', ""])


_WRITERS = {Target.SYSTEMD: systemd_unit, Target.COMPOSE: compose_service, Target.PRESET: preset_file,
            Target.SHELL: shell_script}


def export(dep: Deployment, target: Target | str, opts: ExportOptions | None = None) -> str:
    try:
        kind = Target(target)
    except ValueError:
        raise BadInput(f"--to {target!r}: expected one of {', '.join(t.value for t in Target)}") from None
    return _WRITERS[kind](dep, opts or ExportOptions())
