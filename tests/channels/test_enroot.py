"""The enroot hook: exactly the job's channel in the container, or a clear error, or no change at all.

Unit tests run the hook's decisions in this process with a mounter that
refuses every call (so a test that expects no mount proves none was tried).
The namespace tests run the real hook under ``tests/support/enrootemu.py``:
a private mount namespace (as root) or a user and mount namespace of the
unprivileged lab user, set up the way enroot sets up a container, and look at
``/dev/nvidia-caps-imex-channels`` from inside the container's root.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.channels import enroot as enroothook
from imexctl.config import schema
from imexctl.platform.errors import DeviceError, ExitCode, FileError
from tests.support.enrootemu import emulate
from tests.support.jobtree import FAKE_MAJOR, Tree, tree
from tests.support.privileges import ROOT

REPO = Path(__file__).resolve().parents[2]
LAB_USER = "imexlab"


class RefusingMounter:
    """Records every mount it is asked for and refuses it (EPERM), like an unprivileged caller."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str, str | None, int, str | None]] = []
        self.umounts: list[tuple[str, int]] = []

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        self.calls.append((source, target, fstype, flags, data))
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), target)

    def umount(self, target: str, flags: int) -> None:
        self.umounts.append((target, flags))


class AcceptingMounter(RefusingMounter):
    """Records every mount and pretends it worked (nothing is mounted: the hook's own checks then fail)."""

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        self.calls.append((source, target, fstype, flags, data))


class BrokenMounter(RefusingMounter):
    """Fails with an exception no mount(2) raises: a bug."""

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        raise RuntimeError("boom")


class AnyMount(dict):  # type: ignore[type-arg]
    """A mountinfo that says every mount id is ``(point, tags, fstype)``."""

    def __init__(self, tags: tuple[str, ...], fstype: str = "ext4") -> None:
        super().__init__()
        self.info = ("/", tags, fstype)

    def get(self, key: object, default: object = None) -> object:
        return self.info


@pytest.fixture
def t() -> Iterator[Tree]:
    with tree(major=1) as made:  # /dev/null (1:3) stands for the channel in the unit tests
        yield made


@pytest.fixture
def rootfs(t: Tree) -> Path:
    path = t.base / "rootfs"
    (path / "dev").mkdir(parents=True)
    return path


def _env(t: Tree, rootfs: Path, job_id: int | None = 77, **extra: str) -> dict[str, str]:
    environ = t.base / "environ"
    environ.touch()
    return t.env(job_id, ENROOT_ROOTFS=str(rootfs), ENROOT_ENVIRON=str(environ), **extra)


def _run(t: Tree, env: dict[str, str], mounter: Any, **kw: Any) -> int:
    return enroothook.run(env, mounter=mounter, uid=0, uid_map=None, read_map=False, **kw)


class TestNothingToDo:
    def test_outside_a_job_nothing_is_done(self, t: Tree, rootfs: Path) -> None:
        """enroot started outside a Slurm job: exit 0, no mount, environment untouched."""
        m = RefusingMounter()
        env = _env(t, rootfs, None)
        assert _run(t, env, m) == 0
        assert m.calls == [] and Path(env["ENROOT_ENVIRON"]).read_text() == ""

    def test_job_without_a_domain_here_is_left_alone(self, t: Tree, rootfs: Path) -> None:
        """A job with no imexctl state on this tray: exit 0, no mount."""
        m = RefusingMounter()
        assert _run(t, _env(t, rootfs), m) == 0
        assert m.calls == []

    def test_another_users_job_is_left_alone(self, t: Tree, rootfs: Path) -> None:
        """The job id of another user's job in the environment changes nothing."""
        t.add_job(77, uid=5000, minor=3, channel_path="/dev/null")
        m = RefusingMounter()
        assert enroothook.run(_env(t, rootfs), mounter=m, uid=42, uid_map=None, read_map=False) == 0
        assert m.calls == []

    def test_domain_without_a_channel_is_left_alone(self, t: Tree, rootfs: Path) -> None:
        """``[policy] channels = none`` (Slurm's switch/nvidia_imex owns channels): no change."""
        t.add_job(77, uid=0, minor=None)
        m = RefusingMounter()
        assert _run(t, _env(t, rootfs), m) == 0
        assert m.calls == []

    def test_unreadable_config_warns_and_changes_nothing(
        self, t: Tree, rootfs: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A config the hook cannot use: one warning line, exit 0, the container starts unchanged."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        t.config.chmod(0o666)
        m = RefusingMounter()
        assert _run(t, _env(t, rootfs), m) == 0
        err = capsys.readouterr().err
        assert m.calls == [] and err.count("\n") == 1 and "left as enroot set it up" in err

    @pytest.mark.parametrize(
        "state",
        [
            "no-run-dir",
            "run-dir-writable-by-others",
            "jobs-is-a-symlink",
            "state-not-json",
            "state-without-fields",
            "no-proc-devices",
            "config-invalid",
            "config-path-with-nul",
        ],
    )
    def test_job_without_a_channel_here_is_never_stopped(
        self, t: Tree, rootfs: Path, state: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Whatever the tray's imexctl state, a job without a usable channel here exits 0 with no mount, even closed."""
        t.set_on_error("closed")
        job_dir = t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        env = _env(t, rootfs)
        jobs = t.paths.run_dir / "jobs"
        if state == "no-run-dir":
            shutil.rmtree(t.paths.run_dir)
        elif state == "run-dir-writable-by-others":
            t.paths.run_dir.chmod(0o777)
        elif state == "jobs-is-a-symlink":
            jobs.rename(t.base / "elsewhere")
            jobs.symlink_to(t.base / "elsewhere")
        elif state == "state-not-json":
            (job_dir / "state.json").write_text("{")
        elif state == "state-without-fields":
            (job_dir / "state.json").write_text("{}")
        elif state == "no-proc-devices":
            shutil.rmtree(t.paths.run_dir)
            (t.base / "proc" / "devices").unlink()
        elif state == "config-invalid":
            t.config.write_text("this is not ini\n")
        else:
            env["IMEXCTL_CONFIG"] = f"{t.config}\0x"
        m = RefusingMounter()
        assert _run(t, env, m) == 0
        assert m.calls == [] and Path(env["ENROOT_ENVIRON"]).read_text() == ""
        assert capsys.readouterr().err.count("\n") <= 1

    def test_not_run_by_enroot_in_a_job_without_a_channel_exits_0(self, t: Tree) -> None:
        """Run by hand in a job with no domain here, without ENROOT_ROOTFS/ENROOT_ENVIRON: nothing to do."""
        t.set_on_error("closed")
        assert _run(t, t.env(77), RefusingMounter()) == 0


@pytest.fixture
def closed(t: Tree) -> Tree:
    """``[containers] on_error = closed``: a failed restriction stops the container."""
    t.set_on_error("closed")
    return t


@pytest.mark.usefixtures("closed")
class TestErrorsWhenClosed:
    def test_missing_channel_is_a_clear_error(self, t: Tree, rootfs: Path) -> None:
        """State says the job has channel 3 here, the node is gone: an error naming job, node and what to run."""
        t.add_job(77, uid=0, minor=3)
        m = RefusingMounter()
        with pytest.raises(DeviceError, match=r"job 77: channel .*/channel3 is missing .*imexctl status"):
            _run(t, _env(t, rootfs), m)
        assert m.calls == []

    def test_main_prints_one_line_and_exits_71(self, t: Tree, rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The hook's entry point turns the error into one stderr line and exit 71 (enroot stops the start)."""
        t.add_job(77, uid=os.getuid(), minor=3)
        rc = enroothook.main(_env(t, rootfs))
        err = capsys.readouterr().err
        assert rc == int(ExitCode.OSERR) == 71
        assert err.startswith("imexctl enroot hook: job 77: channel ") and err.count("\n") == 1
        assert "the container was not started ([containers] on_error = closed): run 'imexctl doctor'" in err

    def test_a_bug_while_restricting_stops_the_container_with_70(
        self, t: Tree, rootfs: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An unexpected exception after the job's channel was found: a HookBug (exit 70) naming it."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        with pytest.raises(enroothook.HookBug, match="internal error: RuntimeError: boom; the container was not") as e:
            _run(t, _env(t, rootfs), BrokenMounter(), mountinfo=lambda: AnyMount(("master:1",)))
        assert e.value.exit_code == ExitCode.SOFTWARE == 70 and capsys.readouterr().err == ""

    def test_not_run_by_enroot_is_an_error(self, t: Tree) -> None:
        """In a job with a channel but without ENROOT_ROOTFS/ENROOT_ENVIRON: an error saying how it is meant to run."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        with pytest.raises(FileError, match="run this as an enroot hook"):
            _run(t, t.env(77), RefusingMounter())

    def test_wrong_major_is_an_error(self, t: Tree, rootfs: Path) -> None:
        """A node whose major is not /proc/devices' nvidia-caps-imex-channels is not the job's channel."""
        (t.base / "proc" / "devices").write_text("Character devices:\n 99 nvidia-caps-imex-channels\n")
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        with pytest.raises(DeviceError, match="has major 1, not 99"):
            _run(t, _env(t, rootfs), RefusingMounter())

    def test_driver_without_channels_is_an_error(self, t: Tree, rootfs: Path) -> None:
        """No nvidia-caps-imex-channels in /proc/devices: the driver is not loaded, say so."""
        (t.base / "proc" / "devices").write_text("Character devices:\n  1 mem\n")
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        with pytest.raises(DeviceError, match="is the NVIDIA driver loaded"):
            _run(t, _env(t, rootfs), RefusingMounter())

    def test_host_root_as_container_root_is_refused(self, t: Tree) -> None:
        """ENROOT_ROOTFS=/ would hide the host's channels: refused before any mount."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        m = RefusingMounter()
        env = _env(t, Path("/"))
        with pytest.raises(FileError, match="refusing to change the host's /dev"):
            _run(t, env, m)
        assert m.calls == []

    @pytest.mark.parametrize("where", ["dev", "dev/nvidia-caps-imex-channels"])
    def test_symlink_in_the_image_is_not_followed(self, t: Tree, rootfs: Path, where: str) -> None:
        """An image whose /dev or channel directory is a symlink cannot redirect the mounts."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        link = rootfs / where
        if link.exists():
            link.rmdir()
        link.symlink_to(t.base)
        m = RefusingMounter()
        with pytest.raises(FileError, match="symbolic link or not a directory"):
            _run(t, _env(t, rootfs), m, mountinfo=lambda: AnyMount(()))
        assert m.calls == []

    def test_shared_mount_point_is_refused(self, t: Tree, rootfs: Path) -> None:
        """A mount point whose mount is shared would propagate the tmpfs: refused before mounting."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        m = RefusingMounter()
        with pytest.raises(FileError, match="is shared and would propagate"):
            _run(t, _env(t, rootfs), m, mountinfo=lambda: AnyMount(("shared:1",)))
        assert m.calls == []

    def test_the_first_mount_is_a_tmpfs_over_the_channel_directory(self, t: Tree, rootfs: Path) -> None:
        """On a slave mount the hook first mounts a small tmpfs (nosuid, noexec) over the directory, by fd."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        m = RefusingMounter()
        with pytest.raises(FileError, match=r"cannot mount tmpfs on .*/rootfs/dev/nvidia-caps-imex-channels: "):
            _run(t, _env(t, rootfs), m, mountinfo=lambda: AnyMount(("master:1",)))
        ((source, target, fstype, flags, data),) = m.calls
        assert (source, fstype, flags) == ("tmpfs", "tmpfs", enroothook.MS_NOSUID | enroothook.MS_NOEXEC)
        assert target.startswith("/proc/self/fd/") and data is not None and "mode=0755" in data
        assert not (rootfs / "dev" / "nvidia-caps-imex-channels").exists()  # made for the mount, removed again

    def test_a_failure_after_the_tmpfs_detaches_it(self, t: Tree, rootfs: Path) -> None:
        """Once the tmpfs is mounted, any later failure unmounts it lazily, so enroot's view comes back."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        m = AcceptingMounter()
        with pytest.raises(FileError, match="the new tmpfs is not where it was mounted"):
            _run(t, _env(t, rootfs), m, mountinfo=lambda: AnyMount(("master:1",)))
        assert [c[2] for c in m.calls] == ["tmpfs"]
        ((target, flags),) = m.umounts
        assert target.startswith("/proc/self/fd/") and flags == enroothook.MNT_DETACH


class TestErrorsWhenOpen:
    def test_default_is_open(self) -> None:
        """Without [containers] on_error the hook lets a container start when it fails (the schema agrees)."""
        assert enroothook.ON_ERROR_DEFAULT == "open" == schema.SCHEMA["containers"]["on_error"][0]

    @pytest.mark.parametrize("written", [None, "open", "sometimes"])
    def test_missing_channel_warns_and_starts(
        self, t: Tree, rootfs: Path, written: str | None, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """State says channel 3, the node is gone: exit 0, one line naming job, node and policy, and the variable."""
        if written is not None:
            t.set_on_error(written)
        t.add_job(77, uid=0, minor=3)
        m = RefusingMounter()
        env = _env(t, rootfs)
        assert _run(t, env, m) == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and m.calls == []
        assert err.startswith("imexctl enroot hook: job 77: channel ") and "/channel3 is missing" in err
        assert "the container starts with the nvidia-caps-imex-channels enroot gave it, not only channel3" in err
        assert ("is neither open nor closed" in err) == (written == "sometimes")
        (line,) = [ln for ln in Path(env["ENROOT_ENVIRON"]).read_text().splitlines() if ln]
        assert line.startswith("IMEXCTL_ENROOT_HOOK_WARNING=job 77: channel ") and "on_error = open" in line

    def test_refused_mount_warns_and_starts(self, t: Tree, rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The kernel refuses the tmpfs: exit 0, a line that names the mount and the kernel's reason."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        m = RefusingMounter()
        assert _run(t, _env(t, rootfs), m, mountinfo=lambda: AnyMount(("master:1",))) == 0
        err = capsys.readouterr().err
        assert "cannot mount tmpfs on " in err and "Operation not permitted" in err and "on_error = open" in err
        assert len(m.calls) == 1 and m.umounts == []  # nothing mounted, nothing to undo

    def test_a_bug_while_restricting_warns_and_starts(
        self, t: Tree, rootfs: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An unexpected exception after the job's channel was found: exit 0 and a line naming it."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        assert _run(t, _env(t, rootfs), BrokenMounter(), mountinfo=lambda: AnyMount(("master:1",))) == 0
        assert "internal error: RuntimeError: boom; the container starts" in capsys.readouterr().err

    def test_without_an_environment_file_only_stderr_warns(self, t: Tree, capsys: pytest.CaptureFixture[str]) -> None:
        """Not run by enroot (no ENROOT_ENVIRON): the warning goes to stderr alone, exit 0."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        assert _run(t, t.env(77), RefusingMounter()) == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "run this as an enroot hook" in err


def test_mountinfo_is_parsed() -> None:
    """mountinfo lines give mount point, optional fields and file system type by mount id."""
    text = (
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "37 36 0:5 / /x rw shared:3 master:2 - tmpfs tmpfs rw\n"
        "38 36 0:6 / /y rw - tmpfs tmpfs rw\n"
        "garbage\n"
    )
    assert enroothook.parse_mountinfo(text) == {
        36: ("/mnt2", ("master:1",), "ext3"),
        37: ("/x", ("shared:3", "master:2"), "tmpfs"),
        38: ("/y", (), "tmpfs"),
    }


# ---------------------------------------------------------------- in namespaces, as enroot runs hooks


def _lab_uid() -> int | None:
    try:
        return pwd.getpwnam(LAB_USER).pw_uid
    except KeyError:
        return None


needs_root = pytest.mark.skipif(
    not ROOT, reason="needs root: real channel nodes (mknod) and a private mount namespace (unshare --mount)"
)
needs_root_and_lab_user = pytest.mark.skipif(
    not ROOT or _lab_uid() is None or not os.path.exists("/usr/bin/unshare"),
    reason=f"needs root (mknod, runuser) and the unprivileged user {LAB_USER} ('.ci/setup test') "
    "to run the hook in a user namespace as enroot does",
)

MINOR = 77
DECOYS = (0, 7)


class Container:
    """A node tree with the job's channel and two decoys, a container root, and a work directory."""

    def __init__(self, t: Tree, owner: int, *, channel: bool = True) -> None:
        self.t = t
        self.owner = owner
        t.add_job(MINOR, uid=owner, minor=MINOR)
        # channel0 as NVreg_CreateImexChannel0=1 makes it (0666), channel7 another user's job's (0600)
        for minor, mode in zip(DECOYS, (0o666, 0o600)):
            t.mknod(minor, uid=0, mode=mode)
        if channel:
            t.mknod(MINOR, uid=owner)
        self.rootfs = t.base / "rootfs"
        (self.rootfs / "dev").mkdir(parents=True)
        self.work = t.base / "work"
        self.work.mkdir()
        for path in (self.rootfs, self.rootfs / "dev", self.work):
            os.chown(path, owner, owner)

    def run(self, job_id: int = MINOR, **kw: Any) -> dict[str, Any]:
        env = {"SLURM_JOB_ID": str(job_id), "IMEXCTL_CONFIG": str(self.t.config), "SLURMD_NODENAME": "n1"}
        return emulate(rootfs=self.rootfs, host_dev=self.t.base / "dev", workdir=self.work, env=env, **kw)

    def host_listing(self) -> list[str]:
        return sorted(os.listdir(self.t.paths.channel_dir))


@pytest.fixture
def node() -> Iterator[Tree]:
    with tree() as made:
        yield made


def _only_the_job_channel(result: dict[str, Any], owner: int) -> None:
    assert result["rc"] == 0, result["stderr"]
    assert result["stderr"] == ""
    assert result["view"] == [
        {
            "name": f"channel{MINOR}",
            "char": True,
            "major": FAKE_MAJOR,
            "minor": MINOR,
            "host_uid": owner,
            "mode": 0o600,
            "open": "granted",
        }
    ]
    # the image's own request (channel 0, no final newline) stays on its line; the hook's line comes last and wins
    assert result["environ"].endswith(f"NVIDIA_IMEX_CHANNELS=0\nNVIDIA_IMEX_CHANNELS={MINOR}\n")


@needs_root
@pytest.mark.parametrize("dev", ["host", "restricted", "nvidia"])
def test_as_root_only_the_job_channel_is_visible(node: Tree, dev: str) -> None:
    """With the host's /dev, a restricted /dev, or 98-nvidia.sh's bind: the container sees only channel<N>."""
    c = Container(node, owner=1234)
    _only_the_job_channel(c.run(dev=dev), 1234)
    assert c.host_listing() == ["channel0", "channel7", f"channel{MINOR}"]


@needs_root_and_lab_user
@pytest.mark.parametrize("remap_root", [False, True], ids=["map-current-user", "remap-root"])
@pytest.mark.parametrize("dev", ["host", "restricted"])
def test_as_the_job_user_in_a_user_namespace(node: Tree, dev: str, remap_root: bool) -> None:
    """Run like enroot runs hooks for a user (user namespace, ambient capabilities): only the job's channel."""
    uid = _lab_uid()
    assert uid is not None
    c = Container(node, owner=uid)
    _only_the_job_channel(c.run(dev=dev, user=LAB_USER, remap_root=remap_root), uid)
    assert c.host_listing() == ["channel0", "channel7", f"channel{MINOR}"]


@needs_root_and_lab_user
@pytest.mark.parametrize("dev", ["host", "restricted"])
def test_as_the_job_user_without_a_domain_the_container_gets_what_enroot_gives(node: Tree, dev: str) -> None:
    """As found under a real enroot 4.1.2: host /dev shows every node, openable as the host allows; restricted, none."""
    uid = _lab_uid()
    assert uid is not None
    c = Container(node, owner=uid)
    result = c.run(job_id=78, dev=dev, user=LAB_USER)
    assert (result["rc"], result["stderr"]) == (0, "")
    if dev == "restricted":
        assert result["view"] is None  # enroot's tmpfs /dev has no channel directory, and the hook adds none
        return
    opened = {e["name"]: (e["host_uid"], e["open"]) for e in result["view"]}
    # root's nodes are unmapped in the user's namespace (ls showed uid 65534 under enroot)
    assert opened == {
        "channel0": (None, "granted"),  # 0666: any user, as on the host
        "channel7": (None, "EACCES"),  # another user's job's channel: refused, as on the host
        f"channel{MINOR}": (uid, "granted"),
    }


@needs_root_and_lab_user
def test_as_the_job_user_the_hook_leaves_only_a_channel_it_may_open(node: Tree) -> None:
    """With the hook, the job's user sees and may open its channel, and no other node is there to try."""
    uid = _lab_uid()
    assert uid is not None
    c = Container(node, owner=uid)
    result = c.run(dev="host", user=LAB_USER)
    assert [(e["name"], e["open"]) for e in result["view"]] == [(f"channel{MINOR}", "granted")]


@needs_root_and_lab_user
def test_under_slurmds_strict_umask_the_job_user_still_gets_only_its_channel() -> None:
    """The tray's files made under umask 027 (slurmd's at some sites): the job's user's container sees its channel.

    Issue 33: the run directories came out 0750, the hook as the job's user
    could not open them and took that for a job without a domain.
    """
    uid = _lab_uid()
    assert uid is not None
    old = os.umask(0o027)
    try:
        with tree() as made:
            c = Container(made, owner=uid)
            os.umask(old)
            _only_the_job_channel(c.run(dev="host", user=LAB_USER), uid)
    finally:
        os.umask(old)


@needs_root_and_lab_user
@pytest.mark.parametrize("on_error", ["open", "closed"])
def test_a_run_directory_the_job_user_cannot_read_is_no_answer(node: Tree, on_error: str) -> None:
    """Run directory 0750 (made under a strict umask by an earlier version): closed stops, open warns and starts.

    Issue 33: "cannot read" was taken for "no channel", and the container
    started with whatever enroot gave it, even with ``on_error = closed``.
    """
    uid = _lab_uid()
    assert uid is not None
    node.set_on_error(on_error)
    c = Container(node, owner=uid)
    before = c.run(job_id=78, dev="host", user=LAB_USER)["view"]  # what enroot alone gives
    node.paths.run_dir.chmod(0o750)
    result = c.run(dev="host", user=LAB_USER)
    assert result["rc"] == (0 if on_error == "open" else 71), result
    assert result["stderr"].count("\n") == 1, result["stderr"]
    assert "cannot tell whether this job has an IMEX channel here" in result["stderr"]
    assert "Permission denied" in result["stderr"]
    assert result["view"] == before
    assert ("IMEXCTL_ENROOT_HOOK_WARNING=" in result["environ"]) == (on_error == "open")
    assert f"NVIDIA_IMEX_CHANNELS={MINOR}" not in result["environ"]


@needs_root
def test_missing_channel_stops_the_container_with_one_line_when_closed(node: Tree) -> None:
    """on_error = closed, state says the job has a channel, the node is missing: exit 71, one line, nothing mounted."""
    node.set_on_error("closed")
    c = Container(node, owner=1234, channel=False)
    result = c.run(dev="host")
    assert result["rc"] == 71
    assert result["stderr"].count("\n") == 1 and f"channel{MINOR} is missing" in result["stderr"]
    assert "the container was not started" in result["stderr"]
    assert [e["name"] for e in result["view"]] == ["channel0", "channel7"]
    assert result["environ"].endswith("NVIDIA_IMEX_CHANNELS=0")


@needs_root
def test_missing_channel_lets_the_container_start_when_open(node: Tree) -> None:
    """The default (open), the node is missing: exit 0, one line, /dev as enroot made it, the warning variable."""
    c = Container(node, owner=1234, channel=False)
    result = c.run(dev="host")
    assert result["rc"] == 0
    assert result["stderr"].count("\n") == 1 and f"channel{MINOR} is missing" in result["stderr"]
    assert [e["name"] for e in result["view"]] == ["channel0", "channel7"]
    last = result["environ"].rstrip("\n").splitlines()[-1]
    assert last.startswith("IMEXCTL_ENROOT_HOOK_WARNING=job 77: channel ") and "on_error = open" in last


FAILBIND = [sys.executable, "-m", "tests.support.failbind"]


@needs_root
@pytest.mark.parametrize("on_error", ["open", "closed"])
@pytest.mark.parametrize("dev", ["host", "restricted", "nvidia"])
def test_refused_bind_gives_back_what_enroot_set_up(node: Tree, dev: str, on_error: str) -> None:
    """The kernel refuses the bind after the tmpfs went up: the tmpfs is detached again; open starts, closed stops."""
    node.set_on_error(on_error)
    c = Container(node, owner=1234)
    before = c.run(job_id=78, dev=dev)["view"]  # what enroot alone gives a container (no job 78 here)
    result = c.run(dev=dev, hook=FAILBIND)
    assert result["rc"] == (0 if on_error == "open" else 71), result
    assert result["stderr"].count("\n") == 1 and "cannot bind the job's channel onto " in result["stderr"]
    assert "Operation not permitted" in result["stderr"]
    assert result["view"] == before
    assert ("IMEXCTL_ENROOT_HOOK_WARNING=" in result["environ"]) == (on_error == "open")
    assert f"NVIDIA_IMEX_CHANNELS={MINOR}" not in result["environ"]


@needs_root
@pytest.mark.parametrize("on_error", ["open", "closed"])
def test_job_without_a_domain_sees_the_container_unchanged(node: Tree, on_error: str) -> None:
    """Another job id (no state here): the hook changes nothing, whatever the container shows or the policy says."""
    node.set_on_error(on_error)
    c = Container(node, owner=1234)
    result = c.run(job_id=78, dev="host")
    assert (result["rc"], result["stderr"]) == (0, "")
    assert [e["name"] for e in result["view"]] == ["channel0", "channel7", f"channel{MINOR}"]
    assert result["environ"].endswith("NVIDIA_IMEX_CHANNELS=0")


@needs_root
def test_hook_script_runs_the_module(node: Tree, tmp_path: Path) -> None:
    """hooks/enroot/99-imexctl.sh execs ``python -I -m imexctl.channels.enroot`` (a copy, run against this checkout)."""
    python, record = tmp_path / "python", tmp_path / "argv"
    # -I ignores PYTHONPATH: the stand-in interpreter records its argv, drops -I and runs this checkout's imexctl
    python.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n[ "$1" = -I ] && shift\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    text = (REPO / "hooks" / "enroot" / "99-imexctl.sh").read_text()
    assert text.count("/opt/imexctl/bin/python") == 3
    hook = node.base / "99-imexctl.sh"
    hook.write_text(text.replace("/opt/imexctl/bin/python", str(python)))
    hook.chmod(0o755)
    c = Container(node, owner=1234)
    _only_the_job_channel(c.run(dev="host", hook=[str(hook)]), 1234)
    assert record.read_text().split() == ["-I", "-m", "imexctl.channels.enroot"]


def _script_with(tmp_path: Path, python: str) -> subprocess.CompletedProcess[str]:
    """Run a copy of hooks/enroot/99-imexctl.sh whose interpreter is ``python``."""
    text = (REPO / "hooks" / "enroot" / "99-imexctl.sh").read_text()
    hook = tmp_path / "99-imexctl.sh"
    hook.write_text(text.replace("/opt/imexctl/bin/python", python))
    hook.chmod(0o755)
    return subprocess.run([str(hook)], env={}, capture_output=True, text=True, timeout=30, check=False)


def test_hook_script_without_imexctl_exits_0(tmp_path: Path) -> None:
    """On a node without imexctl the hook does nothing and lets the container start."""
    done = _script_with(tmp_path, str(tmp_path / "absent"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("python_exits", "hook_exits"),
    [(0, 0), (70, 70), (71, 71), (1, 0), (2, 0), (120, 0), (137, 0)],
    ids=["done", "closed-bug", "closed", "import-error", "usage", "flush", "killed"],
)
def test_hook_script_stops_a_container_only_on_70_or_71(tmp_path: Path, python_exits: int, hook_exits: int) -> None:
    """Only the module's own stop codes pass through; an interpreter that fails otherwise warns and lets it start."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexit {python_exits}\n")
    python.chmod(0o755)
    done = _script_with(tmp_path, str(python))
    assert (done.returncode, done.stdout) == (hook_exits, "")
    if python_exits in (0, 70, 71):
        assert done.stderr == ""
    else:
        assert done.stderr.count("\n") == 1
        assert f"failed (exit {python_exits}); the container starts as enroot set it up" in done.stderr


@needs_root
def test_shared_propagation_is_refused_in_a_real_namespace(node: Tree) -> None:
    """Under a shared /dev mount (not how enroot starts containers) the hook refuses instead of propagating."""
    node.set_on_error("closed")
    c = Container(node, owner=1234)
    result = c.run(dev="restricted", shared=True)
    assert result["rc"] == int(ExitCode.OSERR)
    assert "is shared and would propagate" in result["stderr"]
    assert result["view"] is None  # the directory made for the mount was removed again; nothing was mounted
