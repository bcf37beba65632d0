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
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "pkg/prometheus/imexctl.rules.yml"
RULE_TESTS = REPO / "tests/alerts/imexctl.rules_test.yml"
RACK_TESTS = REPO / "tests/alerts/imexctl.rack_test.yml"
ROUTE = REPO / "pkg/prometheus/alertmanager.yml"
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
    """Every metric a rule reads is in docs/metrics.md and in imexctl/hooks/metrics.py or the live gauges
    (imexctl/commands/live.py): a misspelt one never fires."""
    from imexctl.commands.live import LIVE_METRICS

    used = set(re.findall(r"\bimexctl_\w+", RULES.read_text()))
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    documented = (REPO / "docs/metrics.md").read_text()
    assert base <= set(metrics.METRICS) | set(LIVE_METRICS)
    assert not [name for name in base if f"`{name}`" not in documented]


def test_every_alert_is_tested_firing() -> None:
    """Each alert has a promtool test case in which it fires."""
    text = RULE_TESTS.read_text() + RACK_TESTS.read_text()
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", text))
    assert fired == set(_alerts())


def test_one_rack_failing_and_the_live_gauges(promtool: str) -> None:
    """promtool test rules: 18 trays of block r01 failing at once give 18 alerts that all carry block r01 (and
    nothing for the working rack); a daemon lost as the live gauges see it fires at once, a peer the daemon no
    longer reaches fires ImexctlDomainDegraded though the prolog saw every peer connected."""
    done = _promtool(promtool, "test", "rules", str(RACK_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


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
    own error_code label (then its expression keeps that label). Once the page has a heading per code (its
    GitHub anchor the code itself), every anchor must be one of them."""
    codes = _error_codes()
    headed = _anchors(REPO / "docs/troubleshooting.md") & codes
    for rule in _rules():
        url = rule["runbook_url"]
        assert url.startswith(RUNBOOK), (rule["alert"], url)
        anchor = url.removeprefix(RUNBOOK)
        if anchor == "{{ $labels.error_code }}":
            assert "error_code)" in rule["expr"].replace(" ", ""), f"{rule['alert']} keeps no error_code label"
            continue
        assert anchor in codes, (rule["alert"], anchor)
        if headed:
            assert anchor in headed, f"{rule['alert']}: no heading {anchor} in docs/troubleshooting.md"


def test_every_alert_keeps_the_block_label() -> None:
    """Every aggregation of every alert keeps block (and instance), so a rack's alerts can be grouped by it."""
    for rule in _rules():
        for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            kept = {x.strip() for x in by.split(",")}
            assert kept == {"le"} or {"instance", "block"} <= kept, (rule["alert"], by)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager (Debian's prometheus-alertmanager) with pkg/prometheus/alertmanager.yml; its URL."""
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if found is None:
        unavailable("alertmanager is not installed (Debian's prometheus-alertmanager; bash .ci/setup test installs it)")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [found, f"--config.file={ROUTE}", f"--storage.path={tmp_path}", f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(f"{url}/-/ready") is not None or proc.poll() is not None, 30, 0.1, what="alertmanager")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _get(url: str) -> Any:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local test server
            body = resp.read()
    except OSError:
        return None
    return json.loads(body) if body.strip().startswith((b"[", b"{")) else body


def test_one_rack_failing_is_one_alertmanager_group(alertmanager: str) -> None:
    """The 18 alerts promtool proves the rules raise when a rack fails (imexctl.rack_test.yml), posted to a real
    Alertmanager with the shipped route, are one group, {alertname, block=r01}, holding all 18 trays."""
    import json
    import urllib.request

    first = RACK_TESTS.read_text().split("\n  - interval:", 2)[1]  # the first case: rack r01
    fired = re.findall(r"- exp_labels: \{([^}]*)\}\n\s+exp_annotations:\n((?:\s+\w+: \".*\"\n)+)", first)
    alerts = [
        {
            "labels": {"alertname": "ImexctlPrologFailures", **dict(kv.split(": ", 1) for kv in labels.split(", "))},
            "annotations": dict(re.findall(r'(\w+): "(.*)"', annotations)),
        }
        for labels, annotations in fired
    ]
    assert len(alerts) == 18
    req = urllib.request.Request(f"{alertmanager}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",  # noqa: S310
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a local test server
        assert resp.status == 200
    groups = wait_for(lambda: _get(f"{alertmanager}/api/v2/alerts/groups") or None, 15, 0.2, what="the groups")
    assert [g["labels"] for g in groups] == [{"alertname": "ImexctlPrologFailures", "block": "r01"}]
    assert sorted(a["labels"]["instance"] for a in groups[0]["alerts"]) == [f"r01-t{i:02d}" for i in range(1, 19)]


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
