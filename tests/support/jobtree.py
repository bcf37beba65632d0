"""A tray's imexctl files as the prolog leaves them, for the TaskProlog and enroot-hook tests.

The tree lives under a base directory that every user may traverse (0755), so
the same tree can be read by the unprivileged lab user through ``runuser``.
The config sets ``[paths] root`` to the base, so ``state.json`` and the channel
node sit where a prolog with that config would put them; they are written with
imexctl's own ``nodestate.write_state`` and ``fsutil.ensure_dir`` (same modes).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imexctl.config import settings
from imexctl.config.paths import Paths
from imexctl.hooks.state import JobState, write_state
from imexctl.platform.fsutil import ensure_dir

#: a major no real device uses on the test machine's channel directory; /proc/devices is faked
FAKE_MAJOR = 234


class Tree:
    """One tray's files: config, fake /proc/devices, run directory, channel directory."""

    def __init__(self, base: Path, *, major: int = FAKE_MAJOR) -> None:
        self.base = base
        self.config = base / "imexctl.conf"
        self.config.write_text(f"[paths]\nroot = {base}\n")
        self.config.chmod(0o644)
        # the tree's own scaffolding gets its modes whatever the umask (a test may set slurmd's 027)
        (base / "proc").mkdir()
        (base / "proc").chmod(0o755)
        (base / "proc" / "devices").write_text(
            f"Character devices:\n  1 mem\n{major} nvidia-caps-imex-channels\n235 nvidia-caps\nBlock devices:\n  8 sd\n"
        )
        (base / "proc" / "devices").chmod(0o644)
        self.major = major
        self.paths = settings.load(self.config, node="n1").paths
        ensure_dir(self.paths.channel_dir, 0o755)

    def set_on_error(self, value: str) -> None:
        """Write ``[containers] on_error = value`` into the config (the enroot hook's policy)."""
        self.config.write_text(f"[paths]\nroot = {self.base}\n[containers]\non_error = {value}\n")

    def env(self, job_id: int | None, **extra: str) -> dict[str, str]:
        """A task's environment: the job id and this tree's config."""
        env = {"IMEXCTL_CONFIG": str(self.config), "SLURMD_NODENAME": "n1", **extra}
        if job_id is not None:
            env["SLURM_JOB_ID"] = str(job_id)
        return env

    def channel_path(self, minor: int) -> Path:
        """Where the prolog puts channel ``minor``."""
        return self.paths.channel_dir / f"channel{minor}"

    def add_job(
        self,
        job_id: int,
        *,
        uid: int,
        minor: int | None,
        channel_path: str | None = None,
        paths: Paths | None = None,
    ) -> Path:
        """``state.json`` for a job, as the prolog writes it (under ``paths``, default this tree's)."""
        jd = (paths or self.paths).job(job_id)
        ensure_dir(jd.path, 0o755)
        path = (
            channel_path if channel_path is not None else (str(self.channel_path(minor)) if minor is not None else "")
        )
        write_state(jd, JobState(job_id, "n1", uid, uid, "u", ("n1",), ("10.0.0.1",), 0, "none", minor, path, 0.0))
        return jd.path

    def mknod(self, minor: int, *, uid: int, major: int | None = None, mode: int = 0o600) -> Path:
        """A real character device node (root only), owned by ``uid``."""
        path = self.channel_path(minor)
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(self.major if major is None else major, minor))
        os.chown(path, uid, uid)
        os.chmod(path, mode)
        return path


@contextmanager
def tree(**kwargs: int) -> Iterator[Tree]:
    """A :class:`Tree` in a fresh directory under /tmp that every user may traverse."""
    base = Path(tempfile.mkdtemp(prefix="imxc", dir="/tmp"))
    try:
        base.chmod(0o755)
        yield Tree(base, **kwargs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
