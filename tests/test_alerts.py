"""The Prometheus alert rules (pkg/prometheus/imexctl.rules.yml): promtool check rules and promtool test rules.

promtool comes with Debian's ``prometheus`` package (``bash .ci/setup test``
installs it).  Without it the promtool tests are skipped, except under
``CI=true``, where they fail: CI must run them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imexctl.hooks import metrics
from tests.support import alertmanager as am
from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "pkg/prometheus/imexctl.rules.yml"
RULE_TESTS = REPO / "tests/alerts/imexctl.rules_test.yml"
RACK_TESTS = REPO / "tests/alerts/imexctl.rack_test.yml"
FLEET_TESTS = REPO / "tests/alerts/imexctl.fleet_test.yml"
#: alerts of a whole block (no instance label): the trays of one block disagree
PER_BLOCK = {"ImexctlVersionSkew"}
ROUTE = am.ROUTE
RUNBOOK = "https://github.com/imexctl/imexctl/blob/main/docs/troubleshooting.md#"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is not installed (Debian's prometheus package has it; bash .ci/setup test installs it)")
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
    """Every metric a rule reads is in docs/metrics.md and in imexctl/hooks/metrics.py, the live gauges
    (imexctl/commands/live.py) or imexctl health's (imexctl/commands/health.py): a misspelt one never fires."""
    from imexctl.commands.health import GAUGES
    from imexctl.commands.live import LIVE_METRICS

    used = set(re.findall(r"\bimexctl_\w+", RULES.read_text()))
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    documented = (REPO / "docs/metrics.md").read_text()
    assert base <= set(metrics.METRICS) | set(LIVE_METRICS) | set(GAUGES)
    assert not [name for name in base if f"`{name}`" not in documented]


def test_every_alert_is_tested_firing() -> None:
    """Each alert has a promtool test case in which it fires."""
    text = RULE_TESTS.read_text() + RACK_TESTS.read_text() + FLEET_TESTS.read_text()
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", text))
    assert fired == set(_alerts())


def test_one_rack_failing_and_the_live_gauges(promtool: str) -> None:
    """promtool test rules: 18 trays of block r01 failing at once give 18 alerts that all carry block r01 (and
    nothing for the working rack); a daemon lost as the live gauges see it fires at once, a peer the daemon no
    longer reaches fires ImexctlDomainDegraded though the prolog saw every peer connected."""
    done = _promtool(promtool, "test", "rules", str(RACK_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_fleet_config_health_staleness_and_versions(promtool: str) -> None:
    """promtool test rules: a bad config pushed to two racks fires ImexctlConfigInvalid on each of their trays at the
    first evaluation, from the live gauges or imexctl health's; a health finding fires with its code; a live file no
    longer refreshed fires after 2 minutes; trays of one block on two versions fire one alert for the block after
    2 hours, and an upgrade that rolls through a block within the hour none."""
    done = _promtool(promtool, "test", "rules", str(FLEET_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_fleet_rules_are_able_to_fail(promtool: str, tmp_path: Path) -> None:
    """The fleet cases fail where a rule is wrong: with the version-skew rule reading only the hooks' build info, or
    the config rule only the live gauges, the expected alerts are missing."""
    (tmp_path / "pkg/prometheus").mkdir(parents=True)
    (tmp_path / "tests/alerts").mkdir(parents=True)
    shutil.copy(FLEET_TESTS, tmp_path / "tests/alerts")
    for old, new, alert in (
        ('imexctl_live_build_info{block!=""} or on (instance) ', "", "ImexctlVersionSkew"),
        (' or imexctl_health_finding{code="config_invalid"}', "", "ImexctlConfigInvalid"),
    ):
        assert old in RULES.read_text()
        (tmp_path / "pkg/prometheus" / RULES.name).write_text(RULES.read_text().replace(old, new))
        done = _promtool(promtool, "test", "rules", str(tmp_path / "tests/alerts" / FLEET_TESTS.name))
        assert done.returncode != 0 and alert in done.stdout + done.stderr, alert


def _rules() -> list[dict[str, str]]:
    """Each alert of the rules file: its name, its expression and its runbook_url, read from the text."""
    out = []
    for chunk in re.split(r"^\s+- alert: ", RULES.read_text(), flags=re.MULTILINE)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        expr = chunk.split("expr:", 1)[1].split("labels:", 1)[0]
        url = re.search(r'runbook_url: "([^"]+)"', chunk)
        out.append({"alert": name, "expr": expr, "runbook_url": url.group(1) if url else ""})
    return out


def _error_codes() -> set[str]:
    """The error codes of docs/exit-codes.md's table (each raised by a class of imexctl/platform/errors.py)."""
    from imexctl.platform import errors

    text = (REPO / "docs/exit-codes.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \| `\d+` \|", text, flags=re.MULTILINE))
    raised = {c.code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ImexctlError)}
    assert documented <= raised | {"doctor_failed"}, documented - raised
    return documented


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but '-' and '_' dropped, blanks to '-'."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_alert_has_a_runbook_at_its_error_codes_anchor() -> None:
    """Each alert's runbook_url is docs/troubleshooting.md#<error code>: a documented error code, or the alert's
    own error_code label (then its expression keeps that label), or its code label of imexctl health's findings
    (each with a heading there); an alert of no code, a heading of the page. Once the page has a heading per code
    (its GitHub anchor the code itself), every anchor must be one of them."""
    from imexctl.commands.health import CODES

    codes = _error_codes()
    anchors = _anchors(REPO / "docs/troubleshooting.md")
    headed = anchors & codes
    assert set(CODES) <= anchors, set(CODES) - anchors
    for rule in _rules():
        url = rule["runbook_url"]
        assert url.startswith(RUNBOOK), (rule["alert"], url)
        anchor = url.removeprefix(RUNBOOK)
        label = re.fullmatch(r"\{\{ \$labels\.(error_code|code) \}\}", anchor)
        if label:
            assert f"{label.group(1)})" in rule["expr"].replace(" ", ""), f"{rule['alert']} keeps no {label.group(1)}"
            continue
        assert anchor in codes or (anchor in anchors and "-" in anchor), (rule["alert"], anchor)
        if headed and anchor in codes:
            assert anchor in headed, f"{rule['alert']}: no heading {anchor} in docs/troubleshooting.md"


def test_every_alert_keeps_the_block_label() -> None:
    """Every aggregation of every alert keeps block (and instance), so a rack's alerts can be grouped by it; an
    alert of a whole block (PER_BLOCK) ends with block alone."""
    for rule in _rules():
        kept = [{x.strip() for x in by.split(",")} for by in re.findall(r"by \(([^)]*)\)", rule["expr"])]
        if rule["alert"] in PER_BLOCK:
            assert kept[0] == {"block"} and all("block" in k for k in kept), (rule["alert"], kept)
            continue
        for by in kept:
            assert by == {"le"} or {"instance", "block"} <= by, (rule["alert"], by)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager (Debian's prometheus-alertmanager) with pkg/prometheus/alertmanager.yml; its URL."""
    with am.running(tmp_path) as url:
        yield url


def expected_alerts(tests: Path, alertname: str, case: int = 0) -> list[dict[str, Any]]:
    """The alerts ``alertname`` fires in a promtool test file's case ``case`` (its first firing eval), as
    Alertmanager's API takes them: labels with the alert's name, annotations."""
    text = tests.read_text().split("\n  - interval:")[1 + case]
    block = text.split(f"alertname: {alertname}\n        exp_alerts:\n          - ", 1)[1].split("\n      - ", 1)[0]
    fired = re.findall(r"exp_labels: \{([^}]*)\}\n\s+exp_annotations:\n((?:\s+\w+: \".*\"\n?)+)", "- " + block)
    return [
        {
            "labels": {"alertname": alertname, **dict(kv.split(": ", 1) for kv in labels.split(", "))},
            "annotations": {k: v.replace('\\"', '"') for k, v in re.findall(r'(\w+): "(.*)"', annotations)},
        }
        for labels, annotations in fired
    ]


def test_one_rack_failing_is_one_alertmanager_group(alertmanager: str) -> None:
    """The 18 alerts promtool proves the rules raise when a rack fails (imexctl.rack_test.yml), posted to a real
    Alertmanager with the shipped route, are one group, {alertname, block=r01}, holding all 18 trays."""
    alerts = expected_alerts(RACK_TESTS, "ImexctlPrologFailures")
    assert len(alerts) == 18
    groups = am.groups(alertmanager, alerts)
    assert groups == {"r01": [f"r01-t{i:02d}" for i in range(1, 19)]}


def test_a_bad_config_on_two_racks_is_one_alertmanager_group_per_block(alertmanager: str) -> None:
    """The ImexctlConfigInvalid alerts promtool proves the rules raise when a bad config reaches racks r01 and r02
    (imexctl.fleet_test.yml), posted to a real Alertmanager with the shipped route: one group per block, each
    holding that rack's trays."""
    alerts = expected_alerts(FLEET_TESTS, "ImexctlConfigInvalid")
    groups = am.groups(alertmanager, alerts)
    assert groups == {"r01": ["r01-t01", "r01-t02"], "r02": ["r02-t01", "r02-t02"]}


def test_shipped_route_groups_by_block() -> None:
    """The route the packages ship groups by alertname and block (amtool's own check accepts it)."""
    assert re.search(r"^  group_by: \[alertname, block\]$", ROUTE.read_text(), flags=re.MULTILINE)
    amtool = shutil.which("amtool")
    if amtool is not None:
        done = subprocess.run([amtool, "check-config", str(ROUTE)], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_operations_page_lists_every_alert() -> None:
    """docs/operations.md names each shipped alert."""
    page = (REPO / "docs/operations.md").read_text()
    assert not [name for name in _alerts() if f"`{name}`" not in page]
