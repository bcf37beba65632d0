"""Run simulated IMEX daemons as real processes on 127.0.0.x for tests.

Every tray gets its own loopback address (127.0.0.x), all share one
SERVER_PORT picked in the 61xxx range, and files live in a short directory
under /tmp (AF_UNIX paths must stay under 108 bytes).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, TypeVar

import psutil

from imexctl.sim.config import load_config, read_nodes_file
from imexctl.sim.ctl import CtlError, gather, request

__all__ = ["SimCluster", "free_port", "wait_for"]

REPO: Path = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def _bindable(addr: str, port: int) -> bool:
    """Whether ``addr:port`` can be bound right now."""
    with socket.socket() as sock:
        try:
            sock.bind((addr, port))
        except OSError:
            return False
    return True


def free_port(addresses: Sequence[str], avoid: int = 0) -> int:
    """Return a random port in 61000..61999 that every address can bind.

    Random rather than sequential, so that test runs sharing the machine
    rarely pick the same (address, port) pair.
    """
    for _ in range(200):
        port = random.randrange(61000, 62000)
        if port != avoid and all(_bindable(a, port) for a in addresses):
            return port
    raise RuntimeError("no free port in 61000..61999")


def wait_for(probe: Callable[[], T | None], timeout: float = 15.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or probe}; last value {last!r}")


class SimCluster:
    """A set of simulated trays sharing one nodes file; kills everything it started."""

    def __init__(self, size: int, *, first: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="imx", dir="/tmp"))
        if first is None:
            first = random.randrange(10, 250 - size)  # spread parallel runs over 127.0.0.x
        self.addresses = [f"127.0.0.{first + i}" for i in range(size)]
        self.port = free_port(self.addresses)
        self.cmd_port = free_port(self.addresses, avoid=self.port)
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.nodes_file = self.write("nodes.cfg", "".join(a + "\n" for a in self.addresses))

    # ------------------------------------------------------------ files

    def write(self, name: str, text: str) -> Path:
        """Write a file in the cluster directory."""
        path = self.dir / name
        path.write_text(text, encoding="utf-8")
        return path

    def sock(self, i: int) -> str:
        """Return tray ``i``'s command socket path."""
        return str(self.dir / f"s{i}")

    def log(self, i: int) -> Path:
        """Return tray ``i``'s log file."""
        return self.dir / f"log{i}"

    def config(self, i: int, **overrides: Any) -> Path:
        """Write tray ``i``'s config.cfg (keys as in design.md source imex-config) and return its path."""
        keys: dict[str, Any] = {
            "LOG_LEVEL": 4,
            "LOG_FILE_NAME": self.log(i),
            "LOG_APPEND_TO_LOG": 1,
            "DAEMONIZE": 0,
            "BIND_INTERFACE_IP": self.addresses[i],
            "SERVER_PORT": self.port,
            "IMEX_NODE_CONFIG_FILE": self.nodes_file,
            "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
            "IMEX_CMD_ENABLED": 1,
            # as imexctl writes it: the tray's own address and one command port for all trays
            "IMEX_CMD_BIND_INTERFACE_IP": self.addresses[i],
            "IMEX_CMD_PORT": self.cmd_port,
            # and a Unix socket, so tests can ask one daemon's state directly
            "IMEX_CMD_UNIX_DOMAIN_PATH": self.sock(i),
            "IMEX_NODE_DISCONNECTED_GRACE_TIME": -1,
        }
        keys.update(overrides)
        text = "".join(f"{k}={v}\n" for k, v in keys.items() if v is not None)
        return self.write(f"c{i}.cfg", text)

    # ------------------------------------------------------------ processes

    def env(self, faults: str = "", extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return a minimal environment: no PATH or HOME, like a Slurm prolog."""
        env = {"PYTHONPATH": str(REPO), "IMEX_SIM_FAULTS": faults}
        env.update(extra or {})
        return env

    def argv(self, config: Path, *args: str) -> list[str]:
        """Return the daemon command line."""
        return [sys.executable, "-m", "imexctl.sim.daemon", "-c", str(config), *args]

    def start(
        self, i: int, *, faults: str = "", args: Sequence[str] = (), env: Mapping[str, str] | None = None, **cfg: Any
    ) -> subprocess.Popen[str]:
        """Start tray ``i`` in the foreground (DAEMONIZE=0) and keep its handle."""
        proc = subprocess.Popen(
            self.argv(self.config(i, **cfg), *args),
            env=self.env(faults, env),
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs[i] = proc
        return proc

    def start_all(self, faults: str = "", **cfg: Any) -> None:
        """Start every tray."""
        for i in range(len(self.addresses)):
            self.start(i, faults=faults, **cfg)

    def ctl(self, *args: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
        """Run the simulated ctl as a process."""
        return subprocess.run(
            [sys.executable, "-m", "imexctl.sim.ctl", *args],
            env=self.env(),
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ------------------------------------------------------------ queries (in-process, fast)

    def state(self, i: int) -> str | None:
        """Return tray ``i``'s ``-q`` state, ``None`` if it does not answer."""
        try:
            return str(request(("unix", self.sock(i)), "query", 2.0)["state"])
        except CtlError:
            return None

    def domain(self, i: int) -> dict[str, Any] | None:
        """Return the ``-N -j`` snapshot as tray ``i``'s ctl builds it, ``None`` if its config is gone.

        The simulated ctl's own code (in-process): every node's command service asked over TCP.
        """
        try:
            cfg = load_config(str(self.dir / f"c{i}.cfg"))
            return gather(cfg, read_nodes_file(cfg.node_config_file), 2.0)
        except (OSError, ValueError):
            return None

    def link(self, i: int, frm: int, to: int) -> str | None:
        """Return the status of ``frm -> to`` as seen by tray ``i``."""
        snap = self.domain(i)
        if snap is None:
            return None
        return str(snap["nodes"][str(frm)]["connections"][str(to)]["status"])

    def wait_up(self, i: int = 0, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until tray ``i`` reports the domain UP and return the snapshot."""

        def up() -> dict[str, Any] | None:
            snap = self.domain(i)
            return snap if snap and snap["status"] == "UP" else None

        return wait_for(up, timeout, what=f"domain UP on tray {i}")

    def log_text(self, i: int) -> str:
        """Return tray ``i``'s log so far."""
        try:
            return self.log(i).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------ clean-up

    def ours(self) -> list[psutil.Process]:
        """Return live processes whose command line names this cluster's directory."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            if str(self.dir) in cmd and proc.pid != os.getpid():
                found.append(proc)
        return found

    def kill_all(self) -> None:
        """Kill every process this cluster started (also daemonized children) and remove files."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stderr is not None:
                proc.stderr.close()
        for stray in self.ours():
            try:
                stray.kill()
                stray.wait(timeout=10)
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
