"""``python -m tests.support.failbind``: imexctl's enroot hook with a kernel that refuses its bind mount.

The real ``mount(2)`` for everything but the bind of the job's node, which fails with EPERM as
it would where an LSM or a locked mount refuses it.  Run as an enroot hook (under the emulation
or a real enroot) to see what the container gets when the hook fails half-way: the tmpfs it
mounted over the channel directory is taken away again.
"""

from __future__ import annotations

import errno
import os
import sys

from imexctl.channels import enroot as enroothook


class FailingBind(enroothook.LibcMounter):
    """The real mounts, except ``MS_BIND``: EPERM."""

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        """Refuse a bind mount; pass everything else to ``mount(2)``."""
        if flags & enroothook.MS_BIND:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM), target)
        super().mount(source, target, fstype, flags, data)


if __name__ == "__main__":
    sys.exit(enroothook.main(mounter=FailingBind()))
