"""The hooks' front door: one way in per hook, top-down in one folder (entry and its fast tier, then the gate, then the
prolog or the teardown), with cli only parsing, dispatching and mapping errors to exit codes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from imexctl.config.settings import Settings
from tests.support.fakes import job_env

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "imexctl"
TIERS = ("imexctl.hooks.gate", "imexctl.hooks.runtime", "imexctl.hooks.prolog")
TIERS += ("imexctl.hooks.teardown", "imexctl.hooks.metrics")
# the console script's interpreter (-I), the checkout first on the path; which of the tiers' modules it loaded
PROBE = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(REPO)!r})\n"
    "from imexctl.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    f"print(json.dumps([rc, sorted(m for m in {TIERS!r} if m in sys.modules)]))\n"
)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog and the epilog run as root")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {f"{node.module}.{a.name}" if node.module == "imexctl.hooks" else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_cli_hands_the_hooks_to_their_front_door_only() -> None:
    """cli reaches into hooks/ through entry alone: no tier, gate or hook of its own."""
    for module in ("cli/__init__.py", "cli/dispatch.py"):
        hooks = {m for m in _imports(PACKAGE / module) if m.startswith("imexctl.hooks")}
        assert hooks == {"imexctl.hooks.entry"}, module


def test_the_front_door_is_light() -> None:
    """At module level entry imports only what ``--version`` needs (cli imports it for every hook run)."""
    tree = ast.parse((PACKAGE / "hooks/entry.py").read_text(encoding="utf-8"))
    top = {
        (n.module if isinstance(n, ast.ImportFrom) else n.names[0].name)
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    assert top == {"__future__", "os", "sys", "time", "imexctl"}


def probe(*argv: str, env: dict[str, str]) -> tuple[int, list[str]]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, *argv], env=env, capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    rc, loaded = json.loads(out.splitlines()[-1])
    return rc, loaded


@pytest.fixture
def skip_cfg(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(policy={"jobs": "partitions", "partitions": "gpu", "fabric": "none"})


@as_root
def test_each_tier_ends_what_it_can_and_loads_nothing_past_it(
    skip_cfg: Settings, make_settings: Callable[..., Settings], root: Path
) -> None:
    """A skipped prolog ends in the fast tier (the gate, no runtime); with metrics it ends in the settings tier (the
    runtime and the gate, no prolog module); an epilog with a directory to remove goes on to the teardown."""
    skipped = job_env(job_id=77, SLURM_JOB_PARTITION="cpu")
    assert skip_cfg.paths.log_file is not None
    skip_cfg.paths.log_file.parent.mkdir(parents=True, exist_ok=True)  # else the settings tier makes it
    assert probe("--config", str(skip_cfg.source), "prolog", env=skipped) == (
        0,
        ["imexctl.hooks.gate"],
    )
    (root / "prom").mkdir()
    metrics = make_settings(
        policy={"jobs": "partitions", "partitions": "gpu", "fabric": "none"}, metrics={"textfile_dir": "/prom"}
    )
    rc, loaded = probe("--config", str(metrics.source), "prolog", env=skipped)
    assert rc == 0 and {"imexctl.hooks.runtime", "imexctl.hooks.gate", "imexctl.hooks.metrics"} <= set(loaded)
    assert "imexctl.hooks.prolog" not in loaded and "imexctl.hooks.teardown" not in loaded
    metrics.paths.job(79).path.mkdir(parents=True)
    rc, loaded = probe("--config", str(metrics.source), "epilog", env=job_env(job_id=79))
    assert rc == 0 and "imexctl.hooks.teardown" in loaded and "imexctl.hooks.prolog" not in loaded
    assert not metrics.paths.job(79).exists()
