"""Corpus family 2: hostile and broken job environments through the hooks (tests/corpus/environment.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.corpus import environment
from tests.corpus._fakes import job_env
from tests.corpus._tray import Tray, ids


@pytest.fixture
def tray(root: Path) -> Tray:
    """A tray under the test's root (tests/conftest.py plants ``proc/devices``)."""
    return Tray(root)


def env_with(changes: Mapping[str, str | None]) -> dict[str, str]:
    env = job_env()
    for var, value in changes.items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    return env


def files_holding(t: Tray, needle: str) -> list[str]:
    """Paths under the tray's root whose name or content holds ``needle``.

    imexctl's own log is left out, and so is ``state.json`` when it records the
    value as the job's user (a JSON string, never a path or a command).
    """
    found = []
    for top, dirs, files in os.walk(t.root):
        for name in dirs + files:
            path = os.path.join(top, name)
            if needle in name:
                found.append(path)
            if name not in files or path.endswith("imexctl.log") or os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if name == "state.json" and json.loads(data)["user"] == needle:
                continue
            if needle.encode() in data:
                found.append(path)
    return found


@pytest.mark.parametrize("case", environment.CASES, ids=ids(environment.CASES))
def test_environment_case(case: environment.EnvCase, tray: Tray) -> None:
    """Each environment case gets its documented outcome, and the tray is clean afterwards."""
    tray.configure(**{s: {k: v.replace("{root}", str(tray.root)) for k, v in kv.items()}
                      for s, kv in case.config.items()})  # fmt: skip
    env = env_with(case.changes)
    out = tray.run(case.hook, env=env)
    if case.code:
        out.assert_failed(case.code, case.exit_code, *case.names)
        assert not [c for c in tray.host.calls if c[0] != "spawn"] or case.code == "domain_busy"
        tray.assert_clean()
        return
    done = out.assert_ok()
    if case.skipped or case.hook == "epilog":
        assert case.skipped in done.get("skipped", "")
        assert (tray.host.calls, tray.host.mknods) == ([], [])
        assert not (tray.root / "run/imexctl/lock").exists(), "a skipped job or idle epilog took the lock"
        notes = sorted((tray.root / "run/imexctl/notes").glob("*"))
        shared = "may share its trays" in done.get("skipped", "")
        assert bool(done.get("told_user")) is shared, done
        if shared:  # the user is told, until the epilog
            assert [n.name for n in notes] == [env["SLURM_JOB_ID"]], notes
            assert done["skipped"] in notes[0].read_text()
            tray.epilog(env).assert_ok()
        tray.assert_clean()
        return
    assert [m[4:] for m in tray.host.mknods] == [case.owner]
    for needle in case.inert:
        assert not files_holding(tray, needle)
        assert not [argv for argv in tray.host.calls if any(needle in a for a in argv)]
    tray.epilog(env).assert_ok()
    tray.assert_clean()
