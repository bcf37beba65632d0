"""One envelope for every ``--json``: each command hands a typed result to ``output``, which alone makes it JSON."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.platform import Record, output
from imexctl.platform.errors import DoctorFailed, GpuError
from tests.support.fakes import FakeGpu, FakeHost, job_env

PACKAGE = Path(__file__).resolve().parents[2] / "imexctl"
KEYS = {"imexctl_result_version", "status", "exit_code", "data", "errors"}


class _Pair(Record):
    name: str
    count: int

    def data(self) -> output.JsonObject:
        return {"name": self.name, "count": self.count}


def test_the_envelope_carries_the_result_as_it_says_itself() -> None:
    """``data`` is the result's own ``data()``; the errors set the status and the exit code."""
    ok = output.envelope(_Pair("a", 2))
    assert ok == {
        "imexctl_result_version": "1",
        "status": "ok",
        "exit_code": 0,
        "data": {"name": "a", "count": 2},
        "errors": [],
    }
    failed = output.envelope(None, [GpuError("NVML: no driver"), DoctorFailed("x")])
    assert (failed["status"], failed["exit_code"], failed["data"]) == ("error", 69, None)
    assert failed["errors"] == [
        {"code": "gpu_failed", "message": "NVML: no driver"},
        {"code": "doctor_failed", "message": "x"},
    ]


def _calls_of_print_json() -> list[tuple[str, ast.expr]]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "print_json":
                found.append((str(path.relative_to(PACKAGE)), node.args[0]))
    return found


def test_every_json_output_hands_over_a_result_never_a_dict() -> None:
    """Every ``print_json`` call passes a name (a typed result) or None, never a dict or list built on the spot."""
    calls = _calls_of_print_json()
    assert {where for where, _ in calls} >= {
        "commands/status.py",
        "commands/health.py",
        "commands/why.py",
        "commands/topology.py",
        "commands/netcheck.py",
        "doctor/run.py",
        "cli/dispatch.py",
    }
    built = [where for where, arg in calls if isinstance(arg, (ast.Dict, ast.List, ast.DictComp, ast.ListComp))]
    assert built == []


@pytest.fixture
def cfg(make_settings: Callable[..., Settings]) -> str:
    return str(make_settings().source)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--json"],
        ["cleanup", "--dry-run", "--json"],
        ["doctor", "--json"],
        ["topology", "--json"],
        ["health", "--check-only", "--json"],
        ["why", "7", "--json"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_command_prints_the_one_envelope(
    argv: list[str], cfg: str, host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command's ``--json`` is the same envelope, whatever it found (why: the job is in no log here)."""
    rc = main(["--config", cfg, *argv], env=job_env(), host=host, gpu=FakeGpu())
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert set(out) == KEYS and out["imexctl_result_version"] == output.RESULT_VERSION
    assert out["exit_code"] == rc and out["status"] == ("ok" if rc == 0 else "error")
    assert out["data"] is not None or (rc != 0 and out["errors"])
    assert [e["code"] for e in out["errors"]][:1] == ([] if rc == 0 else [out["errors"][0]["code"]])
