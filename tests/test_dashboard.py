"""The Grafana dashboard (pkg/prometheus/imexctl.dashboard.json): a dashboard model Grafana imports, whose every
query parses with promtool and reads only documented metrics (issue 35 item 3).

What a dashboard JSON must hold (Grafana's "JSON model" of a dashboard): ``title``, ``uid``, an integer
``schemaVersion``, ``panels`` each with a unique ``id``, a ``type``, a ``title``, a ``gridPos`` on the 24-column
grid and, for a query panel, ``targets`` with unique ``refId``; a data source chosen by the importer through a
``datasource`` template variable (``type: datasource``, ``query: prometheus``) that every panel and target names
by ``uid: ${datasource}``. Grafana itself cannot run here (no package of it in Debian, PyPI or npm), so the model
is checked field by field and the queries by promtool, with Grafana's variables given values.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imexctl.commands.health import GAUGES
from imexctl.commands.live import LIVE_METRICS
from imexctl.hooks import metrics
from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "pkg/prometheus/imexctl.dashboard.json"
#: panel types of Grafana's core visualisations used here
PANEL_TYPES = {"stat", "timeseries", "table", "bargauge", "gauge", "row", "text"}
#: Grafana's own variables, and a value that makes the query valid PromQL
BUILTINS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1d"}
#: what the dashboard must show (the issue's list), each by a metric its queries read
MUST_SHOW = {
    "failures by error code": ("imexctl_hook_runs_total", "by (error_code)"),
    "failures by rack": ("imexctl_hook_runs_total", "by (block)"),
    "time to ready": ("imexctl_time_to_ready_seconds_bucket", "histogram_quantile(0.95"),
    "stale state": ("imexctl_live_stale", ""),
    "lost daemons": ("imexctl_live_daemon_lost", ""),
    "hooks' durations": ("imexctl_hook_duration_seconds_bucket", "histogram_quantile(0.95"),
    "trays whose config does not load": ("imexctl_live_config_invalid", ""),
    "health findings by code": ("imexctl_health_finding", "by (code)"),
    "versions by rack": ("imexctl_live_build_info", "by (block, version)"),
    "the live gauges' age": ("imexctl_live_refresh_timestamp_seconds", "time() -"),
}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def queries(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the query variables."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def concrete(expr: str, dash: dict[str, Any]) -> str:
    """The query with Grafana's variables given values: builtins a duration, the dashboard's own '.*'."""
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    for name in variables(dash):
        expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def test_dashboard_model_holds_what_grafana_needs() -> None:
    """Title, uid, integer schemaVersion, time, templating and panels: each panel with a unique id, a known type,
    a title, a gridPos inside the 24 columns, and targets with unique refIds and an expression; no two panels
    overlap."""
    dash = dashboard()
    assert isinstance(dash["title"], str) and dash["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"])
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert set(dash["time"]) == {"from", "to"} and isinstance(dash["templating"]["list"], list)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["type"] in PANEL_TYPES and p["title"], p.get("title")
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in g.values())
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_the_data_source_is_the_importers_choice() -> None:
    """A 'datasource' variable of Prometheus data sources; every panel and target uses it by uid, none names a
    data source of the machine it was made on."""
    dash = dashboard()
    var = variables(dash)["datasource"]
    assert (var["type"], var["query"]) == ("datasource", "prometheus")
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for p in dash["panels"]:
        assert p["datasource"] == wanted, p["title"]
        assert all(t["datasource"] == wanted for t in p["targets"]), p["title"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == wanted
    assert "__inputs" not in dash, "no import-time input: the variable chooses the data source"


def test_every_variable_a_query_uses_is_defined() -> None:
    """Each $name in a query is a Grafana builtin or a template variable of the dashboard."""
    dash = dashboard()
    known = set(variables(dash)) | {b[1:] for b in BUILTINS}
    used = {m for q in queries(dash) for m in re.findall(r"\$\{?(\w+)\}?", q)}
    assert used <= known, used - known


def test_queries_read_only_documented_metrics() -> None:
    """Every metric a query reads is one imexctl writes (the hooks' file or the live one) and docs/metrics.md
    lists; a misspelt one would draw an empty panel."""
    dash = dashboard()
    used = {m for q in queries(dash) for m in re.findall(r"\bimexctl_\w+", q)}
    base = {re.sub(r"_(bucket|sum|count)$", "", m) for m in used}
    known = set(metrics.METRICS) | set(LIVE_METRICS) | set(GAUGES)
    assert base <= known, base - known
    page = (REPO / "docs/metrics.md").read_text()
    assert not [m for m in base if f"`{m}`" not in page]


def test_dashboard_shows_what_an_admin_asked_for() -> None:
    """Failures by error code and by rack, time to ready (p50, p95), stale state, lost daemons, hooks' durations;
    trays whose config does not load, health findings by code, versions by rack, the live gauges' age."""
    dash = dashboard()
    exprs = queries(dash)
    for what, (metric, shape) in MUST_SHOW.items():
        assert [q for q in exprs if metric in q and shape in q.replace("  ", " ")], what
    ready = [q for q in exprs if "imexctl_time_to_ready_seconds_bucket" in q]
    assert {q.split(",")[0] for q in ready} == {"histogram_quantile(0.5", "histogram_quantile(0.95"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is not installed (Debian's prometheus package; bash .ci/setup test installs it)")
    return found


def _check(promtool: str, exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool check rules on a rules file that records each expression (PromQL parsed as Prometheus does)."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(exprs):
        lines += [f"      - record: imexctl_dashboard:query{i}", f"        expr: {json.dumps(expr)}"]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    return subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_every_query_parses_with_promtool(promtool: str, tmp_path: Path) -> None:
    """Each panel's query (label_values() aside: a Grafana function) is PromQL promtool accepts."""
    dash = dashboard()
    exprs = [concrete(t["expr"], dash) for p in dash["panels"] for t in p["targets"]]
    done = _check(promtool, exprs, tmp_path)
    assert done.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in done.stdout, done.stdout + done.stderr
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "query"]
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
    assert match and match.group(2) == "block"
    assert _check(promtool, [match.group(1)], tmp_path).returncode == 0


def test_the_promtool_check_is_able_to_fail(promtool: str, tmp_path: Path) -> None:
    """A query with a syntax error is refused: the check above proves something."""
    done = _check(promtool, ["sum by (block) (rate(imexctl_hook_runs_total[5m])"], tmp_path)
    assert done.returncode != 0
