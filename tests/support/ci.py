"""What a test does when its machine lacks a prerequisite: skip and say which, or fail under ``CI=true``.

CI must run every test: there a missing tool, an unreachable package index or mirror, or a user that
``.ci/setup test`` should have made is a broken CI machine, and a skip would pass it silently.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

__all__ = ["need_tools", "unavailable", "under_ci"]


def under_ci() -> bool:
    """Say whether this run is CI's (``CI=true`` in the environment)."""
    return os.environ.get("CI") == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it with that reason under ``CI=true``."""
    __tracebackhide__ = True  # the skip's report names the test's line, not this one
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails the test)", pytrace=False)
    pytest.skip(reason)


def need_tools(*tools: str, how: str = "bash .ci/setup test installs it") -> None:
    """Go on when every one of ``tools`` is on PATH; else :func:`unavailable`, naming the missing and ``how``."""
    __tracebackhide__ = True
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed ({how})")
