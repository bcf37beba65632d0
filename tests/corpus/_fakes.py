"""The one place the corpus imports its fakes from.

The fakes are moving from ``imexctl/testing.py`` to ``tests/support/``: when
they do, this import is the only line of the corpus that changes.
"""

from __future__ import annotations

from imexctl.testing import FakeGpu, FakeHost, domain_json, job_env

__all__ = ["FakeGpu", "FakeHost", "domain_json", "job_env"]
