"""nodestate: the node lock (contention, dead holders, hostile lock files) and the job state's marks."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imexctl.config.paths import JobDir
from imexctl.hooks.state import JobState, hooks_idle, mark_state, node_lock, read_state, write_state
from imexctl.platform.errors import FileError, LockTimeout
from tests.support.fakes import FakeHost
from tests.support.privileges import needs_chown


@pytest.fixture
def lock(root: Path) -> Path:
    return root / "run/imexctl/lock"


class TestNodeLock:
    def test_creates_a_private_lock_file_and_holds_it(self, lock: Path) -> None:
        """The lock file is made 0600 and flock'ed for the duration of the block, then free again."""
        with node_lock(lock, FakeHost(), 1):
            assert oct(lock.stat().st_mode & 0o777) == "0o600"
            with lock.open() as f, pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with lock.open() as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def test_a_held_lock_times_out_with_the_documented_error(self, lock: Path) -> None:
        """Another holder for longer than the timeout: LockTimeout (exit 75), polling the host's clock."""
        host = FakeHost()
        with node_lock(lock, host, 1), pytest.raises(LockTimeout, match="for more than 1.5s") as err:  # noqa: SIM117
            with node_lock(lock, host, 1.5):
                pass
        assert int(err.value.exit_code) == 75 and 1001.5 <= host.now < 1001.6

    def test_the_lock_of_a_killed_holder_is_free(self, lock: Path) -> None:
        """A process that dies holding the lock (SIGKILL) leaves the file, not the lock."""
        code = "import fcntl,os,sys,time; f=open(sys.argv[1],'w'); fcntl.flock(f,fcntl.LOCK_EX); print(1,flush=True); time.sleep(60)"
        lock.parent.mkdir(parents=True)
        lock.touch(mode=0o600)
        holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline() == b"1\n"
        host = FakeHost()
        with pytest.raises(LockTimeout), node_lock(lock, host, 0.1):
            pass
        holder.kill()
        holder.wait()
        with node_lock(lock, host, 0.1):
            assert lock.exists()

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o606, 0o660])
    def test_a_lock_file_others_could_open_is_refused(self, lock: Path, mode: int) -> None:
        """Whoever can open the lock file can flock it and hold every hook back: refused, and left alone."""
        lock.parent.mkdir(parents=True)
        lock.touch()
        lock.chmod(mode)
        with (
            pytest.raises(
                FileError, match=f"with mode 0600, not a regular file of uid {os.geteuid()} with mode {mode:04o}"
            ),
            node_lock(lock, FakeHost(), 0.1),
        ):
            pass
        assert lock.stat().st_mode & 0o777 == mode

    @needs_chown
    def test_a_lock_file_of_another_user_is_refused(self, lock: Path) -> None:
        lock.parent.mkdir(parents=True)
        lock.touch(mode=0o600)
        os.chown(lock, 4242, 4242)
        with (
            pytest.raises(FileError, match="not a regular file of uid 4242 with mode 0600"),
            node_lock(lock, FakeHost(), 0.1),
        ):
            pass

    @pytest.mark.parametrize("target_exists", [True, False])
    def test_a_symlink_is_never_followed(self, lock: Path, root: Path, target_exists: bool) -> None:
        """A symlink at the lock path (to a file or nowhere): refused; the target is neither created nor opened."""
        target = root / "target"
        if target_exists:
            target.write_text("precious\n")
            target.chmod(0o600)
        lock.parent.mkdir(parents=True)
        lock.symlink_to(target)
        with pytest.raises(FileError, match="is a symbolic link \\(not followed\\)"), node_lock(lock, FakeHost(), 0.1):
            pass
        assert (target.read_text() if target_exists else target.exists()) == ("precious\n" if target_exists else False)

    def test_a_fifo_is_refused_without_blocking(self, lock: Path) -> None:
        lock.parent.mkdir(parents=True)
        os.mkfifo(lock, 0o600)
        with pytest.raises(FileError, match="not a FIFO"), node_lock(lock, FakeHost(), 0.1):
            pass


class TestHooksIdle:
    """The admin's checks try the lock once: idle or a hook in flight, never a wait."""

    def test_free_lock_is_held_for_the_block_then_released(self, lock: Path) -> None:
        host = FakeHost()
        with hooks_idle(lock) as idle:
            assert idle is True
            with pytest.raises(LockTimeout), node_lock(lock, host, 0.1):  # a prolog waits for the block
                pass
        with node_lock(lock, host, 0.1):
            pass

    @pytest.mark.parametrize("create", [True, False])
    def test_a_held_lock_is_in_flight_at_once(self, lock: Path, create: bool) -> None:
        host = FakeHost()
        with node_lock(lock, host, 1), hooks_idle(lock, create=create) as idle:
            assert idle is False
        assert host.slept == []

    def test_without_create_nothing_is_made(self, lock: Path) -> None:
        with hooks_idle(lock, create=False) as idle:
            assert idle is True
        assert not lock.parent.exists()

    def test_an_unsafe_lock_is_refused_as_the_hooks_refuse_it(self, lock: Path) -> None:
        lock.parent.mkdir(parents=True)
        lock.write_text("")
        lock.chmod(0o666)
        for create in (True, False):
            with pytest.raises(FileError, match="must be a regular file"), hooks_idle(lock, create=create):
                pass


class TestMarks:
    def _state(self, root: Path) -> JobDir:
        jd = JobDir(42, root / "42")
        jd.path.mkdir()
        write_state(jd, JobState(42, "gb01", 1000, 1000, "u", ("gb01",), ("10.0.0.1",), 61042, "exec", 43, "/c", 1.0))
        return jd

    def test_marks_are_kept_apart(self, root: Path) -> None:
        """set_up and ended are recorded one after the other, neither erasing the other."""
        jd = self._state(root)
        assert mark_state(jd, set_up=5.0) and mark_state(jd, ended=9.0)
        state = read_state(jd)
        assert state is not None and (state.set_up, state.ended, state.port) == (5.0, 9.0, 61042)

    def test_no_state_no_mark(self, root: Path) -> None:
        assert mark_state(JobDir(7, root / "7"), ended=1.0) is False

    def test_a_state_from_before_the_marks_reads_as_unmarked(self, root: Path) -> None:
        """state.json written by an earlier version (no set_up, no ended): nothing was set up as far as cleanup knows."""
        jd = self._state(root)
        data = json.loads(jd.state.read_text())
        del data["set_up"], data["ended"]
        jd.state.write_text(json.dumps(data))
        state = read_state(jd)
        assert state is not None and (state.set_up, state.ended) == (0.0, 0.0)

    def test_a_state_from_a_later_version_reads_by_the_fields_this_one_knows(self, root: Path) -> None:
        """state.json written by a later version (a rolling upgrade's downgrade, a mixed fleet): keys this version
        does not know are left out, never a reason to take the job for one without state."""
        jd = self._state(root)
        data = json.loads(jd.state.read_text())
        data["a_later_key"] = {"x": 1}
        jd.state.write_text(json.dumps(data))
        state = read_state(jd)
        assert state is not None and (state.job_id, state.port, state.channel_minor) == (42, 61042, 43)
