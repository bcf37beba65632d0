"""Corpus family 4: hostile and broken ``nvidia-imex-ctl`` output (tests/corpus/ctl_output.py).

Through the prolog (the readiness wait), through ``imexctl status``, through
the parsers alone, and real commands that never stop printing through
``RealHost.run``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from imexctl.imex.ctl import parse_domain_json, parse_query
from imexctl.platform.errors import CommandError, OutputError
from imexctl.platform.host import MAX_OUTPUT, RealHost
from tests.corpus import ctl_output
from tests.corpus._fakes import job_env
from tests.corpus._tray import Tray, ids


@pytest.fixture
def tray(root: Path) -> Tray:
    """A tray under the test's root (tests/conftest.py plants ``proc/devices``)."""
    return Tray(root)


ADDRESSES = ["10.0.0.1", "10.0.0.2"]  # gb01, gb02: the trays of job_env()


def answer(t: Tray, case: ctl_output.CtlCase) -> None:
    t.host.q_outputs = [case.q]
    if case.nj is not None:
        t.host.domain = case.nj


@pytest.mark.parametrize("case", ctl_output.CASES, ids=ids(ctl_output.CASES))
def test_prolog(case: ctl_output.CtlCase, tray: Tray) -> None:
    """The readiness wait turns each answer into READY, not ready at the deadline, or a fatal error, and rolls back."""
    answer(tray, case)
    out = tray.prolog(job_env())
    if case.code:
        out.assert_failed(case.code, case.exit_code, *case.names)
        if case.code == "not_ready":
            assert out.events("imex.not_ready"), "the timeout logs the last connection table"
    else:
        out.assert_ok()
        tray.epilog(job_env()).assert_ok()
    tray.assert_clean()


@pytest.mark.parametrize("case", [c for c in ctl_output.CASES if c.parse is not None],
                         ids=ids([c for c in ctl_output.CASES if c.parse is not None]))  # fmt: skip
def test_parser(case: ctl_output.CtlCase) -> None:
    """The parser alone parses the output, or raises OutputError (never another exception) saying why."""
    if case.nj is None:
        text, parse = case.q[1], parse_query
    else:
        text, parse = case.nj(list(ADDRESSES))[1], parse_domain_json  # type: ignore[assignment]
    if not case.parse:
        parse(text)
        return
    with pytest.raises(OutputError) as info:
        parse(text)
    assert case.parse in str(info.value) and len(str(info.value)) < 1000


@pytest.mark.parametrize("case", ctl_output.DOMAIN, ids=ids(ctl_output.DOMAIN))
def test_status_tells_what_the_ctl_said(case: ctl_output.CtlCase, tray: Tray) -> None:
    """`imexctl status --json` on a tray with a running job shows any -N answer, or why it is unreadable, and exits 0."""
    tray.prolog(job_env()).assert_ok()
    answer(tray, case)
    out = tray.run("status", "--json", env={})
    out.assert_no_crash()
    assert out.rc == 0 and len(out.stdout) < 100_000, out.stdout[:2000]
    domain = json.loads(out.stdout)["data"]["jobs"][0]["domain"]
    if case.parse:
        assert case.parse in domain["error"]
    tray.epilog(job_env()).assert_ok()
    tray.assert_clean()


@pytest.mark.parametrize("case", ctl_output.ENDLESS, ids=ids(ctl_output.ENDLESS))
def test_realhost_bounds_a_command(case: ctl_output.Endless) -> None:
    """A real command that prints without end or never answers is killed in bounded time and memory."""
    # one that prints without end is ended by the output cap, however slowly a loaded machine lets it print
    # (its timeout is then only a hang guard); one that never answers by its 0.5 s timeout
    capped = "printed more than" in case.names
    start = time.monotonic()
    with pytest.raises(CommandError) as info:
        RealHost().run([sys.executable, "-c", case.code], timeout_s=30.0 if capped else 0.5)
    # unbounded, the command would run (and print) for ever: the bound tells the two apart, with a loaded
    # machine's margin (the precise timeout is subprocess's)
    assert time.monotonic() - start < 60.0
    assert all(name in str(info.value) for name in case.names), str(info.value)[:300]
    assert len(info.value.output) <= MAX_OUTPUT + 65536
