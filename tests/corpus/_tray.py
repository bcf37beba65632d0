"""One simulated tray for the corpus: a node root, a config, the fakes, and the "nothing left" check.

Every corpus case runs imexctl the way slurmd does, in-process:
``imexctl.cli.main(argv, env=..., host=FakeHost(...), gpu=FakeGpu(...))``,
over real files under a temporary root.  :meth:`Tray.leftovers` lists what a
run left behind that a clean tray must not hold: any new file or directory
other than the shared infrastructure (``INFRASTRUCTURE``), a live daemon, an
active unit, a channel node, or a held node lock.  Channel nodes are real
only as root (``FakeHost.real_nodes``, CAP_MKNOD); as another user the
corpus runs too, and a leftover channel is then invisible to this check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from imexctl import cli
from tests.corpus._fakes import FakeGpu, FakeHost
from tests.support.racks import rack_addresses

__all__ = ["DOCUMENTED", "INFRASTRUCTURE", "ROOT_ONLY", "TRAYS", "Outcome", "Tray", "ids"]

ROOT = Path(__file__).resolve().parents[2]

#: gb01..gb18 -> 10.0.0.1..18, one NVL72 rack.
TRAYS: dict[str, list[str]] = rack_addresses()

#: What any run may leave on a clean tray (relative to the root): the shared
#: directories, the node lock (which must not be held), the record of domains
#: torn down here (hooks/remnants.py, pruned by age) and imexctl's own log.
INFRASTRUCTURE: frozenset[str] = frozenset({
    "run", "run/imexctl", "run/imexctl/jobs", "run/imexctl/notes", "run/imexctl/lock", "run/imexctl/remnants.json",
    "var", "var/log", "var/log/imexctl.log",
    "dev", "dev/nvidia-caps-imex-channels",
})  # fmt: skip


def _documented() -> dict[str, int]:
    """error_code -> exit code, as docs/exit-codes.md's error table lists them."""
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"^\| `([a-z_]+)` \| `(\d+)` \|", text, flags=re.MULTILINE)}


#: The documented (error_code -> exit code) pairs every failing case must match.
DOCUMENTED: Mapping[str, int] = _documented()

#: Skip mark for the cases that give a file to another uid (chown needs CAP_CHOWN).
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: giving a file to another uid needs CAP_CHOWN")

_SUMMARIES = ("prolog.done", "epilog.done", "cleanup.done", "imexctl.failed")


@dataclasses.dataclass
class Outcome:
    """What one ``imexctl`` command did: exit code, output, and its JSON log lines."""

    rc: int
    stdout: str
    stderr: str
    lines: list[dict[str, Any]]

    def events(self, name: str) -> list[dict[str, Any]]:
        """The log lines of one event."""
        return [line for line in self.lines if line.get("event") == name]

    @property
    def failure(self) -> dict[str, Any]:
        """The one line that reports the failure: a hook summary with ``ok: false``, or ``imexctl.failed``."""
        found = [line for line in self.lines if line.get("event") in _SUMMARIES and line.get("ok") is not True
                 and line.get("error_code") not in (None, "log_file")]  # fmt: skip
        assert found, f"no failure line (exit {self.rc}) in:\n{self.stderr[-3000:]}"
        return found[-1]

    def assert_failed(self, code: str, exit_code: int, *names: str) -> None:
        """Exit ``exit_code`` (the documented one for ``code``) with one failure line naming ``names``."""
        assert DOCUMENTED.get(code) == exit_code, f"{code} -> {exit_code} is not in docs/exit-codes.md"
        self.assert_no_crash()
        line = self.failure
        got = (self.rc, line["error_code"], line["exit_code"])
        reason = line["reason"]
        assert got == (exit_code, code, exit_code), f"expected {code} ({exit_code}), got {got}: {reason[:1000]!r}"
        for name in names:
            assert name in reason, f"{name!r} not named in {reason[:1000]!r}"
        assert len(reason) < 2000, f"the reason floods the log ({len(reason)} chars): {reason[:300]!r}..."

    def assert_ok(self) -> dict[str, Any]:
        """Exit 0 with a hook summary ``ok: true``; returns that summary."""
        self.assert_no_crash()
        done = [line for line in self.lines if line.get("event") in _SUMMARIES and line.get("ok") is True]
        assert (self.rc, len(done)) == (0, 1), f"exit {self.rc}:\n{self.stderr[-3000:]}"
        return done[0]

    def assert_no_crash(self) -> None:
        """No unexpected exception (imexctl.crashed, exit 70 with a traceback)."""
        assert not self.events("imexctl.crashed"), self.events("imexctl.crashed")[0].get("exception", "")[-2000:]
        assert "Traceback" not in self.stderr


class Tray:
    """A tray under ``root`` with a FakeHost that resolves gb01..gb18."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = FakeHost(addresses={k: list(v) for k, v in TRAYS.items()}, real_nodes=os.geteuid() == 0)
        self.gpu = FakeGpu()
        self.config = root / "imexctl.conf"
        self.before: set[str] | None = None
        self.configured = False

    # ------------------------------------------------------------ set-up

    def configure(self, **sections: Mapping[str, Any]) -> Path:
        """Write a root-owned 0644 config: the corpus defaults, overridden per section."""
        base: dict[str, dict[str, Any]] = {
            "paths": {"root": str(self.root)},
            "daemon": {"backend": "exec", "kill_grace_s": 1, "stop_timeout_s": 1},
            "readiness": {"deadline_s": 5, "poll_initial_s": 0.03, "poll_max_s": 1},
        }
        for name, kv in sections.items():
            base.setdefault(name, {}).update(kv)
        text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) for s, kv in base.items())
        return self.write_config(text)

    def write_config(self, text: str) -> Path:
        """Write ``text`` as the config file, root-owned, 0644."""
        self.config.write_text(text, encoding="utf-8")
        os.chmod(self.config, 0o644)
        self.configured = True
        return self.config

    def write(self, rel: str, text: str, mode: int = 0o644) -> Path:
        """Write a file under the root (parents created), e.g. ``etc/imexctl/hosts``."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        os.chmod(path, mode)
        return path

    # ------------------------------------------------------------ running

    def run(self, *argv: str, env: Mapping[str, str] | None = None) -> Outcome:
        """Run ``imexctl -v --config <cfg> ARGV`` in-process, as slurmd would, and capture everything."""
        if not self.configured:
            self.configure()
        if self.before is None:
            self.before = self._tree()
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = cli.main(["-v", "--config", str(self.config), *argv], env=dict(env or {}), host=self.host,
                          gpu=self.gpu)  # fmt: skip
        text = err.getvalue()
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        stray = [line for line in text.splitlines() if line and not line.startswith("{")]
        assert not stray, f"stderr lines that are not JSON log lines: {stray[:3]}"
        return Outcome(rc, out.getvalue(), text, lines)

    def prolog(self, env: Mapping[str, str]) -> Outcome:
        """``imexctl prolog`` with slurmd's environment ``env``."""
        return self.run("prolog", env=env)

    def epilog(self, env: Mapping[str, str]) -> Outcome:
        """``imexctl epilog`` with slurmd's environment ``env``."""
        return self.run("epilog", env=env)

    # ------------------------------------------------------------ what is left

    def _tree(self) -> set[str]:
        found: set[str] = set()
        for top, dirs, files in os.walk(self.root, followlinks=False):
            rel = os.path.relpath(top, self.root)
            for name in dirs + files:
                found.add(os.path.normpath(os.path.join(rel, name)))
        return found

    def leftovers(self) -> list[str]:
        """Everything a run left that a clean tray must not hold (empty when clean)."""
        before = self.before or set()
        found = sorted(p for p in self._tree() - before if p not in INFRASTRUCTURE)
        found += [f"live process {pid}: {' '.join(p.info.cmdline)}" for pid, p in self.host.procs.items() if p.alive]
        found += [f"active unit {u}" for u, st in self.host.units.items() if st.get("ActiveState") == "active"]
        if self._lock_held():
            found.append("node lock held")
        return found

    def _lock_held(self) -> bool:
        lock = self.root / "run/imexctl/lock"
        if not lock.exists():
            return False
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def assert_clean(self) -> None:
        """Nothing left on the tray: no daemon, per-job file or directory, channel, state, or held lock."""
        left = self.leftovers()
        assert not left, f"left on the tray: {left}"

    def job_files(self, job_id: int = 42) -> list[str]:
        """The names in the job's directory (sorted)."""
        path = self.root / "run/imexctl/jobs" / str(job_id)
        return sorted(os.listdir(path)) if path.is_dir() else []


def ids(cases: Sequence[Any]) -> list[str]:
    """The case ids, checked unique (one case = one id)."""
    names = [c.id for c in cases]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    return names
