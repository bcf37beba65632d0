"""Corpus family 5: name resolution of the job's trays through the prolog (tests/corpus/resolution.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.platform.errors import CommandError
from tests.corpus import resolution
from tests.corpus._fakes import job_env
from tests.corpus._tray import Tray, ids


@pytest.fixture
def tray(root: Path) -> Tray:
    """A tray under the test's root (tests/conftest.py plants ``proc/devices``)."""
    return Tray(root)


def set_up(case: resolution.ResolveCase, t: Tray) -> None:
    for name, found in case.dns.items():
        if found is None:
            t.host.addresses.pop(name, None)
        else:
            t.host.addresses[name] = list(found)
    if case.fails is not None:

        def failing(name: str) -> list[str]:
            raise CommandError(("getaddrinfo", name), f"cannot resolve {name!r}: {case.fails}")

        t.host.resolve = failing  # type: ignore[method-assign]
    if case.hosts is not None:
        t.write("etc/imexctl/hosts", case.hosts)
        t.configure(resolve={"method": "hosts_file"})


@pytest.mark.parametrize("case", resolution.CASES, ids=ids(resolution.CASES))
def test_resolution_case(case: resolution.ResolveCase, tray: Tray) -> None:
    """Every tray resolves to exactly one usable, distinct address, or the prolog names each tray that does not."""
    set_up(case, tray)
    env = job_env(nodelist=case.nodelist)
    out = tray.prolog(env)
    if case.code:
        out.assert_failed(case.code, case.exit_code, *case.names)
        assert not [c for c in tray.host.calls if c[0] == "spawn"], "a daemon was started for unresolved trays"
    else:
        out.assert_ok()
        nodes = (tray.root / "run/imexctl/jobs/42/nodes_config.cfg").read_text().splitlines()
        assert list(case.nodes) == nodes
        tray.epilog(env).assert_ok()
    tray.assert_clean()
