"""Run the whole test suite as four pytest processes side by side: ``python -m tests``.

The real-Slurm and booted-node labs (markers ``slurm`` and ``systemd``) spend most of their time waiting on
slurmd, systemd, the simulator's domain formation and Slurm's own delays (a requeued job waits out its first
run's credential, 121 s), so each Slurm version's lab runs in a pytest process of its own
(``IMEXCTL_LAB_SLURM``: tests/lab/conftest.py; the labs' names, subnets and ports are per version, made to run
side by side: tests/lab/versions.py ``LabNames``), the booted nodes with the 22.05 lab, while everything else
runs in a fourth. Together they select exactly what a plain ``python -m pytest`` selects (it still runs
everything in one process). Each process writes its output to a log file; this prints a progress line now and
then, each log when its process ends, and exits non-zero when any failed.

    python -m tests                 # every part, side by side (the README's test command)
    python -m tests -- -x -k nvml   # extra pytest arguments, passed to every part
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
#: each part: its marker expression and, for a lab, the Slurm version it brings up (tests/lab/conftest.py)
PARTS: dict[str, tuple[str, str | None]] = {
    "labs-22.05": (LABS, "22.05"),
    "labs-24.11": ("slurm", "24.11"),
    "labs-26.05": ("slurm", "26.05"),
    "rest": (f"not ({LABS})", None),
}
PROGRESS_S = 60.0


def _start(
    name: str, marker: str, slurm: str | None, extra: list[str], logdir: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start one pytest process in its own process group, its output in ``logdir/<name>.log``."""
    log = logdir / f"{name}.log"
    env = dict(os.environ)
    if slurm:
        env["IMEXCTL_LAB_SLURM"] = slurm
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-m", marker, *extra],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
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
        for name, (marker, slurm) in PARTS.items():
            procs[name], logs[name] = _start(name, marker, slurm, extra, logdir)
            print(f"tests: part {name!r} (-m {marker!r}) started, log {logs[name]}", flush=True)
        codes: dict[str, int] = {}
        last_progress = time.monotonic()
        while len(codes) < len(procs):
            for name, proc in procs.items():
                if name not in codes and proc.poll() is not None:
                    codes[name] = proc.returncode
                    print(f"\n===== part {name!r} (-m {PARTS[name][0]!r}): exit {proc.returncode} =====", flush=True)
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
