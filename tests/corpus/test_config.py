"""Corpus family 3: hostile and broken configuration through the prolog (tests/corpus/config.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.corpus import config
from tests.corpus._fakes import job_env
from tests.corpus._tray import ROOT_ONLY, Tray, ids


@pytest.fixture
def tray(root: Path) -> Tray:
    """A tray under the test's root (tests/conftest.py plants ``proc/devices``)."""
    return Tray(root)


def set_up(case: config.ConfigCase, t: Tray) -> None:
    """Write the case's config and files under the tray, then run its prepare step."""
    if case.text is not None:
        t.write_config(case.text.replace("{root}", str(t.root)))
    else:
        t.configure(**config.merged(case, t.root))
    for rel, data in case.files.items():
        path = t.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o644)
    if case.prepare is not None:
        other = case.prepare(t.root, t.config)
        if other is not None:
            t.config = other


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[ROOT_ONLY] if c.root_only else []) for c in config.CASES], ids=ids(config.CASES)
)
def test_config_case(case: config.ConfigCase, tray: Tray) -> None:
    """A bad config exits 78 naming file, section and key, or the file and what is wrong with it."""
    set_up(case, tray)
    out = tray.prolog(job_env())
    if case.ok:
        out.assert_ok()
        tray.epilog(job_env()).assert_ok()
    else:
        out.assert_failed("config_invalid", 78, *(n.replace("{root}", str(tray.root)) for n in case.names))
    tray.assert_clean()


def test_every_key_of_the_schema_has_a_bad_value_case() -> None:
    """The corpus refuses a bad value for every key imexctl has (a new key needs a case)."""
    covered = {(s, k) for c in config.CASES for s, kv in c.sections.items() for k in kv if not c.ok}
    keys = {(s, k) for s, kv in config.schema.SCHEMA.items() for k in kv}
    # free-form keys: partitions is a comma list (any text is a list of names)
    assert keys - covered == {("policy", "partitions")}
