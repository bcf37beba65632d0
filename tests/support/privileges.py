"""Skip marks for the few tests that need root, each saying exactly why."""

from __future__ import annotations

import os

import pytest

ROOT = os.geteuid() == 0

#: giving a file to another uid
needs_chown = pytest.mark.skipif(not ROOT, reason="needs root: giving a file to another uid (chown) needs CAP_CHOWN")
#: making real character device nodes
needs_mknod = pytest.mark.skipif(not ROOT, reason="needs root: making character device nodes needs CAP_MKNOD")
