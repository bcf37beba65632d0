"""The Prometheus alert rules (pkg/prometheus/imexctl.rules.yml): promtool check rules and promtool test rules.

promtool comes with Debian's ``prometheus`` package (``bash .ci/setup test``
installs it).  Without it the promtool tests are skipped, except under
``CI=true``, where they fail: CI must run them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from imexctl.hooks import metrics

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "pkg/prometheus/imexctl.rules.yml"
RULE_TESTS = REPO / "tests/alerts/imexctl.rules_test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI=true: bash .ci/setup test installs Debian's prometheus package")
        pytest.skip("promtool is not installed (Debian's prometheus package has it; bash .ci/setup test installs it)")
    return found


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def _alerts() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), flags=re.MULTILINE)


def test_rules_pass_promtool_check(promtool: str) -> None:
    """promtool check rules accepts the file: valid YAML, PromQL and templates."""
    done = _promtool(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


def test_rules_fire_on_their_sample_series(promtool: str) -> None:
    """promtool test rules: each alert fires on its sample series, with its labels and text, and only then."""
    done = _promtool(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_test_is_able_to_fail(promtool: str, tmp_path: Path) -> None:
    """The rule tests can fail: with a threshold no sample reaches, the expected alert is missing."""
    (tmp_path / "pkg/prometheus").mkdir(parents=True)
    (tmp_path / "tests/alerts").mkdir(parents=True)
    (tmp_path / "pkg/prometheus" / RULES.name).write_text(RULES.read_text().replace(") >= 3\n", ") >= 30\n"))
    shutil.copy(RULE_TESTS, tmp_path / "tests/alerts")
    done = _promtool(promtool, "test", "rules", str(tmp_path / "tests/alerts" / RULE_TESTS.name))
    assert done.returncode != 0 and "ImexctlPrologFailuresRepeated" in done.stdout + done.stderr


def test_rules_use_only_documented_metrics() -> None:
    """Every metric a rule reads is in docs/metrics.md and imexctl/hooks/metrics.py (a misspelt one never fires)."""
    used = set(re.findall(r"\bimexctl_\w+", RULES.read_text()))
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    documented = (REPO / "docs/metrics.md").read_text()
    assert base <= set(metrics.METRICS)
    assert not [name for name in base if f"`{name}`" not in documented]


def test_every_alert_is_tested_firing() -> None:
    """Each alert has a promtool test case in which it fires."""
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", RULE_TESTS.read_text()))
    assert fired == set(_alerts())


def test_operations_page_lists_every_alert() -> None:
    """docs/operations.md names each shipped alert."""
    page = (REPO / "docs/operations.md").read_text()
    assert not [name for name in _alerts() if f"`{name}`" not in page]
