"""fsutil: atomic writes, directory creation and tree removal that never follow symlinks."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl.fsutil import atomic_write, ensure_dir, read_text_nofollow, remove_file, remove_tree


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
        assert stat.S_IMODE(os.stat(tmp_path / "a/b/c").st_mode) & 0o777 == 0o750 & ~_umask()

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

    def test_remove_file_removes_symlink_not_target(self, tmp_path: Path) -> None:
        """remove_file unlinks a symlink and leaves its target."""
        (tmp_path / "t").write_text("x")
        (tmp_path / "l").symlink_to(tmp_path / "t")
        assert remove_file(tmp_path / "l") is True
        assert (tmp_path / "t").exists() and remove_file(tmp_path / "l") is False


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
