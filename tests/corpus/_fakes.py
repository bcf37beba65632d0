"""The one place the corpus imports its fakes from.

If the fakes move again, this import is the only line of the corpus that changes.
"""

from __future__ import annotations

from tests.support.fakes import FakeGpu, FakeHost, domain_json, job_env

__all__ = ["FakeGpu", "FakeHost", "domain_json", "job_env"]
