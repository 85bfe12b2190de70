"""Where an rpc-server on this machine computes: the CPUs it may run on and the threads it runs.

A ggml-rpc-server on a CPU backend computes with its own threads on the cores its process is allowed
(its affinity: `taskset`, cgroups). Several of them on one machine are one pool of cores: a device
list that names three RPC devices may be two cores' worth (planner/search/verdict.py's shared-cores
term). Only a server listening on this machine's loopback can be looked at; of any other the answer
is unknown, and the planner treats it as an independent machine.

The thread count is the server's `-t`/`--threads`, else the pinned rpc-server's default,
max(1, std::thread::hardware_concurrency() / 2) (tools/rpc/rpc-server.cpp, rpc_server_params).
Best-effort like every probe in planner.hardware: nothing found is None, never an error.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
THREAD_FLAGS = ("-t", "--threads")


@dataclass(frozen=True)
class ServerCpus:
    cpus: tuple[int, ...]    # the host CPUs the process may run on, ascending
    threads: int             # its compute threads


def default_threads(n_cpus_online: int) -> int:
    """rpc-server's default -t: half the CPUs the C++ runtime reports, at least one."""
    return max(1, n_cpus_online // 2)


def threads_of(cmdline: list[str], n_cpus_online: int) -> int:
    """The compute threads an rpc-server command line asks for (the last -t wins, as its parser reads)."""
    threads = default_threads(n_cpus_online)
    for flag, value in zip(cmdline, cmdline[1:], strict=False):
        if flag in THREAD_FLAGS and value.isdigit() and int(value) > 0:
            threads = int(value)
    return threads


def listening_pids() -> dict[int, int]:
    """TCP port -> the process listening on it (any address), for the processes this user may see;
    one scan of the system's sockets, however many endpoints are then looked up."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as exc:
        log.debug("cannot list TCP sockets: %s", exc)
        return {}
    return {c.laddr.port: int(c.pid) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.pid}


def rpc_server_cpus(endpoint: str, pids: Mapping[int, int] | None = None) -> ServerCpus | None:
    """The CPUs and threads of the rpc-server at `endpoint` ("host:port") when it runs on this machine;
    `pids`: listening_pids() when the caller looks up several endpoints (default: scanned here)."""
    host, _, port = endpoint.rpartition(":")
    if host not in LOOPBACK_HOSTS or not port.isdigit():
        return None
    pid = (listening_pids() if pids is None else pids).get(int(port))
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        cpus = tuple(sorted(proc.cpu_affinity() or ()))
        cmdline = proc.cmdline()
    except (psutil.Error, OSError, AttributeError) as exc:   # AttributeError: no cpu_affinity on this OS
        log.debug("rpc-server %s (pid %d): %s", endpoint, pid, exc)
        return None
    if not cpus:
        return None
    return ServerCpus(cpus, threads_of(cmdline, psutil.cpu_count() or len(cpus)))
