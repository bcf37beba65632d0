"""Run the whole test suite as two pytest processes side by side: ``python -m tests``.

The real-Slurm and booted-node labs (markers ``slurm`` and ``systemd``) spend most of their time waiting on
slurmd, systemd and the simulator's domain formation, so they run in one pytest process while everything
else runs in another. Together they select exactly what a plain ``python -m pytest`` selects (it still runs
everything in one process). Each process writes its output to a log file; this prints a progress line now and
then, each log when its process ends, and exits non-zero when either failed.

    python -m tests                 # both parts, side by side (the README's test command)
    python -m tests -- -x -k nvml   # extra pytest arguments, passed to both parts
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LABS = "slurm or systemd"
PARTS = {"labs": LABS, "rest": f"not ({LABS})"}
PROGRESS_S = 60.0


def _start(name: str, marker: str, extra: list[str], logdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one pytest process in its own process group, its output in ``logdir/<name>.log``."""
    log = logdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-m", marker, *extra],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Interrupt every part still running, as Ctrl-C would, then SIGKILL what is left after 120 s.

    SIGINT, not SIGTERM: pytest turns it into KeyboardInterrupt and still runs the fixtures' teardown, so
    the labs take their slurmds, network namespaces and booted nodes down (SIGTERM would leave them).
    """
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # pytest alone: its own children end in its teardown
    deadline = time.monotonic() + 120
    for proc in procs.values():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _last_line(log: Path) -> str:
    """The last non-empty line of ``log`` (pytest's summary when it has ended)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main(argv: list[str]) -> int:
    extra = argv[1:] if argv[:1] == ["--"] else argv
    if any(a.startswith("-m") for a in extra):
        print("python -m tests: selects its own markers; run python -m pytest -m ... for one part", file=sys.stderr)
        return 2
    logdir = Path(tempfile.mkdtemp(prefix="imexctl-tests-"))
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # a shell's background job starts with SIGINT ignored, and the parts would inherit that (exec keeps an
    # ignored signal ignored): with a handler here they start with the default, which pytest turns into
    # KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for name, marker in PARTS.items():
            procs[name], logs[name] = _start(name, marker, extra, logdir)
            print(f"tests: part {name!r} (-m {marker!r}) started, log {logs[name]}", flush=True)
        codes: dict[str, int] = {}
        last_progress = time.monotonic()
        while len(codes) < len(procs):
            for name, proc in procs.items():
                if name not in codes and proc.poll() is not None:
                    codes[name] = proc.returncode
                    print(f"\n===== part {name!r} (-m {PARTS[name]!r}): exit {proc.returncode} =====", flush=True)
                    sys.stdout.write(logs[name].read_text(errors="replace"))
                    sys.stdout.flush()
            if time.monotonic() - last_progress >= PROGRESS_S:
                last_progress = time.monotonic()
                running = [n for n in procs if n not in codes]
                print(f"tests: {time.monotonic() - started:.0f} s, running: {', '.join(running)}", flush=True)
            time.sleep(0.5)
    finally:
        _stop(procs)
    elapsed = time.monotonic() - started
    for name in procs:
        print(f"tests: {name}: exit {codes[name]}: {_last_line(logs[name])}")
    print(f"tests: {elapsed:.0f} s in all")
    # pytest's exit 5 (nothing collected) is a failure here: each part must run tests
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
