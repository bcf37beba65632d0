"""Only IMEX daemons are daemons: a pager, a ctl client or another user's process never blocks a prolog (issue 22).

The rule is :mod:`imexctl.imex.procs`'s: a process of root (or of imexctl's own
user) whose program is ``[commands] nvidia_imex``.  ``TestRealProcesses``
checks it on real processes read from ``/proc``; the other classes check
that the prolog's claim, status, cleanup and the epilog follow it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from structlog.testing import capture_logs

from imexctl.commands.status import collect
from imexctl.config.settings import Settings
from imexctl.hooks.jobs import known_jobs
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import cleanup, epilog
from imexctl.imex import procs as imexproc
from imexctl.imex.daemon import imex_processes, job_processes
from imexctl.platform.errors import DomainBusyError
from imexctl.platform.host import RealHost
from tests.support.fakes import FakeHost, job_env

NOBODY = 65534


@pytest.fixture
def started() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start real processes (killed at the end); each call waits until /proc shows its argv.

    ``runs``: also wait until the process runs that executable (a shell wrapper
    exec's its program: for an instant during that exec /proc shows neither).
    """
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], runs: str | None = None, **kw: Any) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, **kw)
        procs.append(p)
        deadline = time.monotonic() + 10
        while argv[-1].encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes() or runs not in (None, _exe(p.pid)):
            assert time.monotonic() < deadline, f"{argv} never showed its command line (or never ran {runs})"
            time.sleep(0.01)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def _pids(arg: str, command: str) -> list[int]:
    """Pids of the daemons (by the rule) among the processes naming ``arg``."""
    progs = imexproc.programs(command)
    return [p.pid for p in RealHost().processes_with_arg(arg) if imexproc.is_daemon(p, progs, os.geteuid())]


class TestRealProcesses:
    def test_the_configured_binary_is_a_daemon_and_a_pager_is_not(self, tmp_path: Path, started: Any) -> None:
        """A copy of a binary configured as nvidia_imex counts; /usr/bin/tail on the same file does not."""
        imex = tmp_path / "bin/nvidia-imex"
        imex.parent.mkdir()
        shutil.copy2("/usr/bin/tail", imex)
        target = str(tmp_path / "state.json")
        Path(target).write_text("{}\n")
        daemon = started([str(imex), "-f", target])
        started(["/usr/bin/tail", "-f", target])
        assert _pids(target, str(imex)) == [daemon.pid]

    def test_a_symlinked_command_is_resolved(self, tmp_path: Path, started: Any) -> None:
        """nvidia_imex may be a symlink: the kernel shows the file it points to, and that matches."""
        real = tmp_path / "nvidia-imex-580"
        shutil.copy2("/usr/bin/tail", real)
        link = tmp_path / "nvidia-imex"
        link.symlink_to(real)
        target = str(tmp_path / "x.cfg")
        Path(target).write_text("")
        daemon = started([str(link), "-f", target])
        assert _pids(target, str(link)) == [daemon.pid]

    def test_a_binary_replaced_under_a_running_daemon_still_counts(self, tmp_path: Path, started: Any) -> None:
        """A package upgrade deletes the running file: /proc/<pid>/exe then ends in ' (deleted)'."""
        imex = tmp_path / "nvidia-imex"
        shutil.copy2("/usr/bin/tail", imex)
        target = str(tmp_path / "x.cfg")
        Path(target).write_text("")
        daemon = started([str(imex), "-f", target])
        imex.unlink()
        assert os.readlink(f"/proc/{daemon.pid}/exe").endswith(" (deleted)")
        assert _pids(target, str(imex)) == [daemon.pid]

    def test_the_simulator_script_counts_through_its_interpreter(self, tmp_path: Path, started: Any) -> None:
        """A '#!python' program runs as 'python3 <script> -c CFG': argv[1] is the configured script."""
        imex = _script(tmp_path / "nvidia-imex-sim", f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
        cfg = str(tmp_path / "config.cfg")
        daemon = started([imex, "-c", cfg])
        other = started([sys.executable, "-c", "import time; time.sleep(60)", "-c", cfg])
        assert _pids(cfg, imex) == [daemon.pid] and other.pid != daemon.pid

    def test_a_shell_wrapper_that_execs_the_program_is_followed(self, tmp_path: Path, started: Any) -> None:
        """The labs' stand-in: a sh script that sets a variable and execs the simulator with "$@"."""
        sim = _script(tmp_path / "nvidia-imex-sim", f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
        wrapper = _script(tmp_path / "nvidia-imex", f'#!/bin/sh\necho hi >&2\nFAULTS=/x exec {sim} "$@"\n')
        cfg = str(tmp_path / "config.cfg")
        daemon = started([wrapper, "-c", cfg], runs=os.path.realpath(sys.executable))
        assert _pids(cfg, wrapper) == [daemon.pid]
        assert os.path.realpath(sim) in dict(imexproc.programs(wrapper).scripts)

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root: starts a process as another user")
    def test_another_users_copy_of_the_program_is_no_daemon(self, started: Any) -> None:
        """The configured program run by nobody names the config, but is not root's: no daemon."""
        base = Path(tempfile.mkdtemp(prefix="imxstray", dir="/tmp"))  # pytest's tmp_path is root's alone
        try:
            base.chmod(0o755)
            imex = base / "nvidia-imex"
            shutil.copy2("/usr/bin/tail", imex)
            target = base / "x.cfg"
            target.write_text("")
            target.chmod(0o644)
            started([str(imex), "-f", str(target)], user=NOBODY)
            assert [p.uid for p in RealHost().processes_with_arg(str(target))] == [NOBODY]
            assert _pids(str(target), str(imex)) == []
        finally:
            shutil.rmtree(base)


class TestFakeHostRule:
    """The rule on FakeHost's process table, as the prolog, status, cleanup and the epilog see it."""

    def _others(self, host: FakeHost, s: Settings, job_id: int = 7) -> dict[str, int]:
        """A pager, a ctl client and another user's copy of the daemon, all naming job 7's files."""
        jd = s.paths.job(job_id)
        return {
            "pager": host.add_process(["/usr/bin/less", str(jd.state)], uid=0).pid,
            "ctl": host.add_process([s.commands.nvidia_imex_ctl, "-c", str(jd.config), "-N"], uid=0).pid,
            "user": host.add_process([s.commands.nvidia_imex, "-c", str(jd.config)], uid=1000).pid,
            "shell": host.add_process(["/bin/sh", "-c", f"cat {jd.path}/x", f"{jd.path}/x"], uid=1000).pid,
        }

    def test_none_of_them_blocks_a_prolog(self, rt: Runtime, host: FakeHost) -> None:
        """A prolog succeeds beside a pager, a ctl, a user's process and a shell naming another job's files."""
        self._others(host, rt.settings)
        out = prolog(job_env(job_id=42, nodelist="gb[01-02]", node="gb01"), rt)
        assert out.ok

    def test_root_running_the_program_of_a_running_job_blocks_a_prolog(self, rt: Runtime, host: FakeHost) -> None:
        """A daemon of job 7, whose directory is gone but which still runs here, refuses the prolog."""
        host.add_process([rt.settings.commands.nvidia_imex, "-c", str(rt.settings.paths.job(7).config)])
        host.running_jobs.add(7)
        with pytest.raises(DomainBusyError, match="belongs to job 7, which still runs on this node"):
            prolog(job_env(job_id=42, nodelist="gb[01-02]", node="gb01"), rt)

    def test_daemon_of_a_job_that_no_longer_runs_is_cleared(self, rt: Runtime, host: FakeHost) -> None:
        """The same daemon, its job gone from the tray: the prolog stops it (issue 22) and sets up."""
        stray = host.add_process([rt.settings.commands.nvidia_imex, "-c", str(rt.settings.paths.job(7).config)])
        with capture_logs() as logs:
            assert prolog(job_env(job_id=42, nodelist="gb[01-02]", node="gb01"), rt).ok
        assert stray.pid in {pid for pid, _ in host.signals}
        (removed,) = [e for e in logs if e["event"] == "state.removed"]
        assert "leftovers of job 7" in removed["reason"], removed

    def test_status_and_cleanup_know_no_job_of_them(self, rt: Runtime, host: FakeHost) -> None:
        """status lists no job, cleanup signals nobody, and known_jobs is empty."""
        self._others(host, rt.settings)
        assert known_jobs(rt) == []
        assert collect(rt, "gb01").data()["jobs"] == []
        report = cleanup(rt)
        assert report.data()["actions"] == [] and host.signals == []

    def test_the_epilog_ends_roots_ctl_and_leaves_the_rest_alone(self, rt: Runtime, host: FakeHost) -> None:
        """Job 7's epilog ends root's leftover ctl of the job, and signals no pager, shell or user's process."""
        others = self._others(host, rt.settings)
        epilog(job_env(job_id=7), rt)
        assert {pid for pid, _ in host.signals} == {others["ctl"]}

    def test_a_root_ctl_is_ended_by_teardown_but_a_users_is_not(self, make_settings: Any, host: FakeHost) -> None:
        """with_clients adds root's ctl (a killed prolog's probe), never another user's."""
        s = make_settings()
        cfg = s.paths.job(7).config
        root_ctl = host.add_process([s.commands.nvidia_imex_ctl, "-c", str(cfg), "-q"], uid=0)
        host.add_process([s.commands.nvidia_imex_ctl, "-c", str(cfg), "-N"], uid=1000)
        assert job_processes(host, s, cfg) == []
        assert job_processes(host, s, cfg, with_clients=True) == [root_ctl]

    def test_a_units_main_pid_counts_whatever_it_runs(self, make_settings: Any, host: FakeHost) -> None:
        """With systemd, the job's unit's MainPID is its daemon even when a site's wrapper runs it."""
        s = make_settings()
        cfg = s.paths.job(7).config
        wrapped = host.add_process(["/usr/local/sbin/imex-wrapper", "-c", str(cfg)], uid=0)
        assert job_processes(host, s, cfg) == []
        assert job_processes(host, s, cfg, main_pid=wrapped.pid) == [wrapped]
        assert imex_processes(host, s, f"{s.paths.jobs_dir}/", prefix=True) == []


def test_a_python_script_is_not_claimed_by_another_interpreter(tmp_path: Path) -> None:
    """A '#!python' nvidia_imex run by another program (an editor given its path) is no daemon."""
    from imexctl.platform.host import ProcInfo

    imex = _script(tmp_path / "nvidia-imex-sim", f"#!{sys.executable}\n")
    cfg = str(tmp_path / "config.cfg")
    progs = imexproc.programs(imex)
    editor = ProcInfo(1, 0.0, ("/usr/bin/vi", imex, cfg), uid=0, exe="/usr/bin/vi")
    daemon = ProcInfo(2, 0.0, (sys.executable, imex, "-c", cfg), uid=0, exe=os.path.realpath(sys.executable))
    assert not imexproc.is_daemon(editor, progs, 0) and imexproc.is_daemon(daemon, progs, 0)


def test_pips_shell_trampoline_counts(tmp_path: Path, started: Any) -> None:
    """pip's launcher for a long interpreter path: a sh script that execs python with "$0" "$@"."""
    imex = _script(
        tmp_path / "nvidia-imex-sim",
        f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\nimport time\ntime.sleep(60)\n",
    )
    cfg = str(tmp_path / "config.cfg")
    daemon = started([imex, "-c", cfg], runs=os.path.realpath(sys.executable))
    assert _pids(cfg, imex) == [daemon.pid]


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def test_a_wrapper_through_env_names_the_program_not_env(tmp_path: Path) -> None:
    """'exec /usr/bin/env VAR=1 /opt/x "$@"': the program is /opt/x; env is no daemon program."""
    wrapper = _script(tmp_path / "nvidia-imex", '#!/bin/sh\nexec /usr/bin/env A=1 /opt/imex/nvidia-imex "$@"\n')
    progs = imexproc.programs(wrapper)
    assert "/opt/imex/nvidia-imex" in progs.binaries and os.path.realpath("/usr/bin/env") not in progs.binaries
