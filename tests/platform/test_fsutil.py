"""fsutil: atomic writes, directory creation and tree removal that never follow symlinks."""

from __future__ import annotations

import errno
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.platform.fsutil import (
    atomic_write,
    check_private_dir,
    ensure_dir,
    flock_held,
    read_text_nofollow,
    remove_file,
    remove_tree,
)
from tests.support.privileges import needs_chown


@pytest.fixture
def alarm() -> Iterator[None]:
    """Turn a blocking call into a test failure after 5 s instead of a hung suite."""

    def fail(signum: int, frame: object) -> None:
        raise AssertionError("call blocked")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


class TestAtomicWrite:
    def test_creates_file_with_content(self, tmp_path: Path) -> None:
        """A new file gets exactly the given text and reports a change."""
        path = tmp_path / "f.cfg"
        assert atomic_write(path, "A=1\n") is True
        assert path.read_text() == "A=1\n"

    def test_applies_mode_regardless_of_umask(self, tmp_path: Path) -> None:
        """The file gets the requested mode even under a restrictive umask."""
        old = os.umask(0o077)
        try:
            atomic_write(tmp_path / "f", "x", mode=0o644)
        finally:
            os.umask(old)
        assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o644

    def test_unchanged_content_reports_no_change(self, tmp_path: Path) -> None:
        """Writing identical content and mode again returns False and keeps the inode."""
        path = tmp_path / "f"
        atomic_write(path, "same\n", mode=0o600)
        inode = os.stat(path).st_ino
        assert atomic_write(path, "same\n", mode=0o600) is False
        assert os.stat(path).st_ino == inode

    def test_mode_change_alone_rewrites(self, tmp_path: Path) -> None:
        """Same content with a different mode counts as a change and applies the mode."""
        path = tmp_path / "f"
        atomic_write(path, "same\n", mode=0o600)
        assert atomic_write(path, "same\n", mode=0o644) is True
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644

    def test_replaces_symlink_without_following_it(self, tmp_path: Path) -> None:
        """A symlink at the path is replaced by a regular file and its target is untouched."""
        target = tmp_path / "target"
        target.write_text("precious\n")
        link = tmp_path / "link"
        link.symlink_to(target)
        assert atomic_write(link, "new\n") is True
        assert not link.is_symlink() and link.read_text() == "new\n"
        assert target.read_text() == "precious\n"

    def test_replaces_symlink_even_when_target_has_same_content(self, tmp_path: Path) -> None:
        """A symlink to a file with identical content is still replaced, never reported unchanged."""
        target = tmp_path / "target"
        target.write_text("same\n")
        os.chmod(target, 0o644)
        link = tmp_path / "link"
        link.symlink_to(target)
        assert atomic_write(link, "same\n", mode=0o644) is True
        assert not link.is_symlink()

    def test_replaces_file_that_is_not_utf8(self, tmp_path: Path) -> None:
        """An existing file with non-UTF-8 bytes is overwritten, not a crash."""
        path = tmp_path / "f"
        path.write_bytes(b"\xff\xfe garbage")
        assert atomic_write(path, "ok\n") is True
        assert path.read_text() == "ok\n"

    def test_leaves_no_temporary_files(self, tmp_path: Path) -> None:
        """After two writes only the target file is in the directory."""
        atomic_write(tmp_path / "f", "1")
        atomic_write(tmp_path / "f", "2")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]

    def test_refuses_directory_and_cleans_up(self, tmp_path: Path) -> None:
        """A directory at the path makes the write fail and leaves no temporary file."""
        (tmp_path / "d").mkdir()
        with pytest.raises(OSError):
            atomic_write(tmp_path / "d", "x")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]

    @pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EIO])
    def test_a_failed_write_names_the_target_and_leaves_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
    ) -> None:
        """A full, read-only or failing file system: the error names the file being written, not a
        temporary name (or nothing: ENOSPC from write() carries no file name), and no file is left."""

        def fail(fd: int) -> None:
            raise OSError(err, os.strerror(err))

        monkeypatch.setattr(os, "fsync", fail)
        with pytest.raises(OSError) as info:
            atomic_write(tmp_path / "config.cfg", "A=1\n")
        assert (info.value.errno, info.value.filename) == (err, str(tmp_path / "config.cfg"))
        assert info.value.strerror == os.strerror(err)
        assert list(tmp_path.iterdir()) == []

    def test_a_temporary_file_that_cannot_be_made_names_the_target(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """open's own error would name the random temporary name: the target is named instead."""
        real = os.open

        def fail(name: object, *args: object, **kw: object) -> int:
            if os.path.basename(str(name)).startswith(".state.json."):
                raise OSError(errno.EROFS, "Read-only file system", str(name))
            return real(name, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", fail)
        with pytest.raises(OSError) as info:
            atomic_write(tmp_path / "state.json", "{}")
        assert info.value.filename == str(tmp_path / "state.json") and info.value.errno == errno.EROFS

    def test_temporary_names_are_random_and_made_exclusively(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No predictable temporary name: each write gets a fresh random name beside the target."""
        names: list[str] = []
        real = os.replace

        def record(src: str, dst: Path) -> None:
            names.append(os.path.basename(src))
            real(src, dst)

        monkeypatch.setattr(os, "replace", record)
        for i in range(3):
            atomic_write(tmp_path / "f", str(i))
        assert len(set(names)) == 3 and all(n.startswith(".f.") and len(n) > len(".f.") + 4 for n in names)

    def test_a_symlink_planted_at_the_temporary_name_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """O_EXCL | O_NOFOLLOW: a link at the (here forced) temporary name is neither followed nor replaced."""
        victim = tmp_path / "victim"
        victim.write_text("keep")
        monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
        planted = tmp_path / f".state.json.{'01' * 8}"
        planted.symlink_to(victim)
        with pytest.raises(OSError) as info:
            atomic_write(tmp_path / "state.json", "{}")
        assert info.value.errno == errno.EEXIST and info.value.filename == str(tmp_path / "state.json")
        assert victim.read_text() == "keep" and planted.is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == [planted.name, "victim"]


class TestReadTextNofollow:
    def test_reads_regular_file(self, tmp_path: Path) -> None:
        """A regular UTF-8 file is returned as text."""
        (tmp_path / "f").write_text("héllo\n")
        assert read_text_nofollow(tmp_path / "f") == "héllo\n"

    def test_refuses_symlink(self, tmp_path: Path) -> None:
        """A symlink is refused even when its target is a readable file."""
        (tmp_path / "t").write_text("x")
        (tmp_path / "l").symlink_to(tmp_path / "t")
        with pytest.raises(OSError):
            read_text_nofollow(tmp_path / "l")

    def test_refuses_fifo_without_blocking(self, tmp_path: Path, alarm: None) -> None:
        """A FIFO is refused at once instead of blocking until a writer appears."""
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(OSError, match="not a regular file"):
            read_text_nofollow(tmp_path / "fifo")

    def test_non_utf8_is_an_oserror(self, tmp_path: Path) -> None:
        """Bytes that are not UTF-8 raise OSError, which callers already handle."""
        (tmp_path / "f").write_bytes(b"\xff")
        with pytest.raises(OSError, match="not UTF-8"):
            read_text_nofollow(tmp_path / "f")


class TestEnsureDir:
    def test_creates_parents_and_reports_creation(self, tmp_path: Path) -> None:
        """Missing parents are created and True means the last component is new."""
        assert ensure_dir(tmp_path / "a" / "b" / "c", 0o750) is True
        assert (tmp_path / "a/b/c").is_dir()
        assert stat.S_IMODE(os.stat(tmp_path / "a/b/c").st_mode) == 0o750

    @pytest.mark.parametrize("umask", [0o027, 0o077])
    def test_directories_made_now_get_their_mode_whatever_the_umask(self, tmp_path: Path, umask: int) -> None:
        """Under slurmd's umask (027 at some sites) every directory made gets exactly ``mode``; existing ones keep theirs.

        Issue 33: 0755 came out 0750 and hid the job's state and channel from the job's user.
        """
        (tmp_path / "a").mkdir(mode=0o700)
        old = os.umask(umask)
        try:
            assert ensure_dir(tmp_path / "a" / "b" / "c", 0o755) is True
        finally:
            os.umask(old)
        modes = [stat.S_IMODE(os.stat(tmp_path / p).st_mode) for p in ("a", "a/b", "a/b/c")]
        assert modes == [0o700, 0o755, 0o755]

    def test_existing_directory_is_not_created(self, tmp_path: Path) -> None:
        """An existing directory is accepted and reported as not created."""
        (tmp_path / "d").mkdir()
        assert ensure_dir(tmp_path / "d") is False

    def test_refuses_symlinked_component(self, tmp_path: Path) -> None:
        """A symlink anywhere on the way is refused and nothing is created behind it."""
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(OSError, match="not a directory"):
            ensure_dir(tmp_path / "link" / "sub")
        assert list((tmp_path / "elsewhere").iterdir()) == []

    def test_refuses_symlink_as_last_component(self, tmp_path: Path) -> None:
        """A symlink to a directory at the path itself is refused."""
        (tmp_path / "real").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "real")
        with pytest.raises(OSError):
            ensure_dir(tmp_path / "link")

    def test_refuses_regular_file(self, tmp_path: Path) -> None:
        """A regular file in place of a directory is refused."""
        (tmp_path / "f").write_text("")
        with pytest.raises(OSError):
            ensure_dir(tmp_path / "f" / "sub")


class TestPrivateDirectories:
    """``ensure_dir(private_from=...)`` and ``check_private_dir``: the state and lock directories are root's alone."""

    def test_accepts_own_directories_and_creates_them(self, tmp_path: Path) -> None:
        """Directories created now are ours and pass; parents above ``private_from`` are not judged."""
        run = tmp_path / "run" / "imexctl"
        assert ensure_dir(run / "jobs" / "7", 0o755, private_from=run) is True
        check_private_dir(run / "jobs")

    def test_own_directories_a_strict_umask_narrowed_are_opened_up(self, tmp_path: Path) -> None:
        """A run directory an earlier version made 0750 under a strict umask gets 0755 back; above it, nothing changes."""
        run = tmp_path / "run" / "imexctl"
        (run / "jobs").mkdir(parents=True, mode=0o750)
        run.chmod(0o700)
        (tmp_path / "run").chmod(0o750)
        assert ensure_dir(run / "jobs" / "7", 0o755, private_from=run) is True
        modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "run", run, run / "jobs", run / "jobs/7")]
        assert modes == [0o750, 0o755, 0o755, 0o755]

    @pytest.mark.parametrize(
        "mode",
        [
            pytest.param(0o777, id="0777"),
            pytest.param(0o775, id="0775"),
            pytest.param(0o1777, id="sticky-1777"),
            pytest.param(0o757, id="0757"),
        ],
    )
    @pytest.mark.parametrize("where", ["run", "jobs"])
    def test_writable_by_others_is_refused_before_anything_is_made_in_it(
        self, tmp_path: Path, mode: int, where: str
    ) -> None:
        """A run or jobs directory that group or others may write: refused, named with owner and mode,
        and nothing is created inside it."""
        run = tmp_path / "run"
        (run / "jobs").mkdir(parents=True)
        bad = run if where == "run" else run / "jobs"
        os.chmod(bad, mode)
        with pytest.raises(OSError) as info:
            ensure_dir(run / "jobs" / "7", private_from=run)
        assert info.value.errno == errno.EPERM and info.value.filename == str(bad)
        assert f"mode {mode & 0o7777:04o}" in str(info.value) and "not writable by group or others" in str(info.value)
        assert not (run / "jobs" / "7").exists()

    @needs_chown
    def test_owned_by_another_uid_is_refused(self, tmp_path: Path) -> None:
        """A 0755 run directory that another uid owns (it could chmod it any time) is refused."""
        run = tmp_path / "run"
        run.mkdir(mode=0o755)
        os.chown(run, 1501, 1501)
        with pytest.raises(OSError, match="must be owned by root") as info:
            ensure_dir(run / "jobs", private_from=run)
        assert "owner uid 1501, mode 0755" in str(info.value) and not (run / "jobs").exists()

    def test_symlink_in_place_of_the_directory_is_refused(self, tmp_path: Path) -> None:
        """A symlink where the run directory belongs is refused even to a good directory; nothing is made there."""
        (tmp_path / "elsewhere").mkdir(mode=0o755)
        (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(OSError, match="is a symbolic link") as info:
            ensure_dir(tmp_path / "run" / "jobs", private_from=tmp_path / "run")
        assert info.value.errno == errno.ENOTDIR and info.value.filename == str(tmp_path / "run")
        assert list((tmp_path / "elsewhere").iterdir()) == []

    def test_a_file_in_place_of_the_directory_is_refused(self, tmp_path: Path) -> None:
        """A regular file where a private directory belongs is named as not a directory."""
        (tmp_path / "run").write_text("")
        with pytest.raises(OSError, match="is not a directory"):
            check_private_dir(tmp_path / "run")


class TestRemove:
    def test_remove_tree_does_not_follow_symlinks(self, tmp_path: Path) -> None:
        """Symlinks inside the tree are unlinked; what they point to survives."""
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "keep").write_text("keep")
        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "file").write_text("x")
        (tree / "dirlink").symlink_to(outside)
        (tree / "sub" / "filelink").symlink_to(outside / "keep")
        assert remove_tree(tree) is True
        assert not tree.exists()
        assert (outside / "keep").read_text() == "keep"

    def test_remove_tree_on_symlink_removes_only_the_link(self, tmp_path: Path) -> None:
        """A symlink given as the tree itself is removed, its target directory is kept."""
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "f").write_text("x")
        (tmp_path / "link").symlink_to(tmp_path / "real")
        assert remove_tree(tmp_path / "link") is True
        assert not os.path.lexists(tmp_path / "link") and (tmp_path / "real" / "f").exists()

    def test_remove_tree_missing_is_false(self, tmp_path: Path) -> None:
        """Removing a tree that does not exist reports that nothing was removed."""
        assert remove_tree(tmp_path / "nope") is False

    @staticmethod
    def _after_listing(monkeypatch: pytest.MonkeyPatch, tree: Path, meanwhile: Any) -> None:
        """Run ``meanwhile`` once, right after the removal first lists ``tree``: another process's write lands."""
        real, done = os.scandir, []

        def scandir(path: Any) -> Any:
            listed = list(real(path))
            if Path(path) == tree and not done:
                done.append(path)
                meanwhile()
            return iter(listed)

        monkeypatch.setattr(os, "scandir", scandir)

    def test_remove_tree_empties_a_directory_that_gained_an_entry(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An atomic write begins after the listing (the epilog's ``ended`` mark, without the node lock, has made
        its temporary file): the directory is emptied again, where rmdir used to fail with 'Directory not empty'."""
        tree = tmp_path / "42"
        tree.mkdir()
        (tree / "state.json").write_text("{}")
        self._after_listing(monkeypatch, tree, lambda: (tree / ".state.json.0123456789abcdef").write_text("{"))
        assert remove_tree(tree) is True and not os.path.lexists(tree)

    def test_remove_tree_takes_an_entry_that_vanished(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The writer's temporary file is renamed into place after the listing: the listed name is gone."""
        tree = tmp_path / "42"
        tree.mkdir()
        (tree / ".state.json.tmp").write_text("{}")
        self._after_listing(monkeypatch, tree, lambda: os.rename(tree / ".state.json.tmp", tree / "state.json"))
        assert remove_tree(tree) is True and not os.path.lexists(tree)

    def test_remove_tree_gives_up_on_a_directory_that_keeps_filling(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bounded: a writer that never stops makes the removal fail, naming ENOTEMPTY, after a few tries."""
        tree = tmp_path / "42"
        tree.mkdir()
        real, count = os.scandir, []

        def scandir(path: Any) -> Any:
            listed = list(real(path))
            count.append(path)
            (tree / f"f{len(count)}").write_text("x")
            return iter(listed)

        monkeypatch.setattr(os, "scandir", scandir)
        with pytest.raises(OSError) as info:
            remove_tree(tree)
        assert info.value.errno == errno.ENOTEMPTY and len(count) == 5

    def test_remove_tree_and_a_concurrent_atomic_write(self, tmp_path: Path) -> None:
        """For real, in threads: the write either lands before (and is removed) or fails; the removal never fails."""
        import threading

        failures = []
        for i in range(100):
            tree = tmp_path / str(i)
            tree.mkdir()
            (tree / "state.json").write_text("{}")
            go = threading.Event()

            def mark(tree: Path = tree, go: threading.Event = go) -> None:
                go.wait()
                for _ in range(20):
                    try:
                        atomic_write(tree / "state.json", '{"ended": 1}')
                    except OSError:
                        return  # the directory is gone: what the epilog's mark expects

            writer = threading.Thread(target=mark)
            writer.start()
            go.set()
            try:
                remove_tree(tree)
            except OSError as exc:
                failures.append(exc)
            writer.join()
            assert not os.path.lexists(tree) or failures
        assert failures == []

    def test_remove_file_removes_symlink_not_target(self, tmp_path: Path) -> None:
        """remove_file unlinks a symlink and leaves its target."""
        (tmp_path / "t").write_text("x")
        (tmp_path / "l").symlink_to(tmp_path / "t")
        assert remove_file(tmp_path / "l") is True
        assert (tmp_path / "t").exists() and remove_file(tmp_path / "l") is False


def test_flock_held_waits_on_the_callers_clock_then_gives_up(tmp_path: Path) -> None:
    """Held by another open file: tried every pause until the caller's clock passes the timeout; free: taken at once."""

    path = tmp_path / "x.lock"
    path.write_text("")
    now = [0.0]
    naps: list[float] = []

    def nap(s: float) -> None:
        naps.append(s)
        now[0] += s

    def held(fd: int) -> Any:
        return flock_held(fd, 0.1, clock=lambda: now[0], sleep=nap, pause_s=0.04, stuck=TimeoutError("stuck"))

    holder = os.open(path, os.O_RDWR)
    with held(holder):
        waiter = os.open(path, os.O_RDWR)
        with pytest.raises(TimeoutError, match="stuck"), held(waiter):
            pass
        assert naps == [0.04, 0.04, 0.04]
        with pytest.raises(OSError):
            os.fstat(waiter)  # closed, though the lock was never taken
    with pytest.raises(OSError):
        os.fstat(holder)  # closed at the end: the lock is free again
    with held(os.open(path, os.O_RDWR)):
        assert len(naps) == 3  # taken at once


def test_atomic_write_reads_no_more_than_the_new_text_of_what_is_there(tmp_path: Path) -> None:
    """A sparse 4 GiB file at the target: replaced unread; a file of the same size is read once, bounded (issue 33)."""

    def rchar() -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
        raise AssertionError("no rchar")

    path = tmp_path / "imexctl.prom"
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    before = rchar()
    assert atomic_write(path, "a 1\n", mode=0o644) is True
    assert rchar() - before < 1 << 16
    assert path.read_text() == "a 1\n"
    before = rchar()
    assert atomic_write(path, "a 1\n", mode=0o644) is False  # the same: compared, not rewritten
    assert atomic_write(path, "a 2\n", mode=0o644) is True
    assert rchar() - before < 1 << 16
