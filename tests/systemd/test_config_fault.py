"""A fault across a rack is seen and labelled (issue 42), on booted nodes: a bad config pushed to every tray fires
one alert per block within one refresh and one scrape, and a tray right after its boot labels its first failure with
its block. The trays' own files are what promtool's rule test and a real Alertmanager (with the shipped rules and
route) read. The lab: tests/systemd/conftest.py and tests/lab/sysd.py; the metrics as tests/systemd/test_live_gauges.py
turns them on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl.platform.fsutil import atomic_write
from tests.lab.jobs import sbatch
from tests.lab.sysd import SystemdLab
from tests.simhelpers import wait_for
from tests.support import alertmanager as am
from tests.support.ci import unavailable
from tests.systemd.nodes import NODES

pytestmark = pytest.mark.systemd

TEXTFILE_DIR = "/var/lib/node_exporter"
CONF = "etc/imexctl/imexctl.conf"
TOPOLOGY = "/etc/imexctl/topology.conf"
#: each node its own block: one alert group per block
BLOCKS = {"node1": "r01", "node2": "r02"}
UNITS = ("imexctl-metrics.service", "imexctl-metrics.timer")
#: a value the config's check refuses, on its own line (the hooks' error names it)
BAD = "\n[readiness]\ndeadline_s = soon\n"
FILES = ("imexctl.prom", "imexctl-live.prom", "imexctl-health.prom")
RULES = Path(__file__).resolve().parents[2] / "pkg/prometheus/imexctl.rules.yml"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(lab: SystemdLab, node: str, name: str) -> Samples:
    """(sample, labels) -> value of one of the node's files ({} when it has none)."""
    path = lab.node_root(node) / TEXTFILE_DIR.lstrip("/") / name
    if not path.exists():
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for fam in text_string_to_metric_families(path.read_text())
        for s in fam.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    """The value of ``name`` with these labels (``block`` aside), None when the file has no such sample."""
    for (sample, got), v in found.items():
        if sample == name and {k: w for k, w in got if k != "block"} == labels:
            return v
    return None


def blocks(found: Samples) -> set[str | None]:
    return {dict(labels).get("block") for _, labels in found}


@pytest.fixture
def site(sysd: SystemdLab) -> Iterator[dict[str, str]]:
    """Every node: [metrics] textfile_dir, a topology file naming each node's block, the package's metrics units
    installed (the timer off); each node's good config, given back afterwards with the node as it was."""
    saved = {}
    for n in NODES:
        m = sysd.node(n)
        conf = m.merged / CONF
        saved[n] = conf.read_text()
        assert saved[n].count("[paths]\n") == 1, saved[n]
        good = saved[n].replace("[paths]\n", f"[paths]\ntopology_file = {TOPOLOGY}\n")
        atomic_write(conf, good + f"\n[metrics]\ntextfile_dir = {TEXTFILE_DIR}\n", mode=0o644)
        blocks_text = "".join(f"BlockName={b} Nodes={node}\n" for node, b in BLOCKS.items())
        atomic_write(m.merged / TOPOLOGY.lstrip("/"), blocks_text, mode=0o644)
        m.exec(["install", "-d", "-m", "0755", TEXTFILE_DIR])
        m.shell("install -m 0644 systemd/imexctl-metrics.service systemd/imexctl-metrics.timer /etc/systemd/system/",
                cwd="/usr/local/src/imexctl")  # fmt: skip
        m.exec(["systemctl", "daemon-reload"])
    try:
        yield {n: (sysd.node(n).merged / CONF).read_text() for n in NODES}
    finally:
        for n in NODES:
            m = sysd.node(n)
            m.exec(["systemctl", "disable", "--now", "imexctl-metrics.timer"], check=False)
            m.exec(["rm", "-f", *(f"/etc/systemd/system/{u}" for u in UNITS), TOPOLOGY], check=False)
            m.exec(["rm", "-rf", TEXTFILE_DIR, "/run/imexctl/metrics.json"], check=False)
            m.exec(["systemctl", "daemon-reload"], check=False)
            atomic_write(m.merged / CONF, saved[n], mode=0o644)


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool is not installed (Debian's prometheus package; bash .ci/setup test installs it)")
    return found


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager with the shipped route (tests/support/alertmanager.py); its URL."""
    with am.running(tmp_path / "alertmanager") as url:
        yield url


def input_series(node: str, found: Samples) -> list[dict[str, str]]:
    """One scrape of a tray's file as promtool input series: its samples with ``instance`` = the node, one value."""
    out = []
    for (name, labels), v in sorted(found.items()):
        inner = ", ".join(f'{k}="{w}"' for k, w in (("instance", node), *labels))
        out.append({"series": f"{name}{{{inner}}}", "values": f"{v:g}"})
    return out


def promtool_test(promtool: str, tmp: Path, series: list[dict[str, str]], expected: dict[str, list[Any]]) -> None:
    """promtool test rules with the shipped rules over one scrape of the trays' files, evaluated at once:
    ``expected`` is each alertname's exp_alerts. The file is JSON, which YAML reads."""
    cases = [{"eval_time": "0m", "alertname": name, "exp_alerts": alerts} for name, alerts in expected.items()]
    test = {"interval": "1m", "input_series": series, "alert_rule_test": cases}
    path = tmp / "scrape_test.yml"
    path.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [test]}, indent=1))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + path.read_text()


def alert(node: str, severity: str, summary: str, description: str, anchor: str, **labels: str) -> dict[str, Any]:
    """One expected alert of a tray, as the shipped rules word it."""
    return {
        "exp_labels": {"severity": severity, "instance": node, "block": BLOCKS[node], **labels},
        "exp_annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"https://github.com/imexctl/imexctl/blob/main/docs/troubleshooting.md#{anchor}",
        },
    }


def config_invalid(node: str) -> dict[str, Any]:
    """ImexctlConfigInvalid of one tray."""
    return alert(
        node, "critical", f"the imexctl config file on {node} does not load: every prolog there fails",
        "Every job on the tray is refused and the tray drained. `imexctl preflight --config-only` there says what is"
        " wrong in which file; `sinfo -R` shows the hooks' reason.",
        "config_invalid",
    )  # fmt: skip


def prolog_failed(node: str) -> dict[str, Any]:
    """ImexctlPrologFailures of one tray, for config_invalid."""
    return alert(
        node, "warning", f"imexctl prolog failed on {node} (config_invalid)",
        "Slurm drained the tray and requeued the job. `sinfo -R` shows the reason; docs/troubleshooting.md says what"
        " to do for config_invalid.",
        "config_invalid", error_code="config_invalid",
    )  # fmt: skip


def test_a_bad_config_on_every_tray_is_one_alert_per_block_within_one_scrape(
    sysd: SystemdLab, site: dict[str, str], promtool: str, alertmanager: str, tmp_path: Path
) -> None:
    """With the live-gauge timer on and good configs, each tray's live file names its block. A config whose value
    the check refuses is pushed to both trays: within 30 s each live file says config_invalid 1 (it does not go
    stale, though the refresh fails with 78); a job submitted to both fails its prologs, each counted as
    config_invalid in the same directory with the tray's block, each tray drained with the hooks' reason naming
    the file and line (``sinfo -R``), and ``imexctl drains`` folds them into one line per block. One scrape of those files, through promtool's rule test with the
    shipped rules, fires ImexctlConfigInvalid and ImexctlPrologFailures{error_code=config_invalid} on each tray at
    the first evaluation; posted to a real Alertmanager with the shipped route they are one group per block."""
    for n in NODES:
        sysd.node(n).exec(["systemctl", "enable", "--now", "imexctl-metrics.timer"])
    for n in NODES:
        live = wait_for(lambda n=n: (g := samples(sysd, n, "imexctl-live.prom"))
                        and value(g, "imexctl_live_config_invalid") == 0 and g,
                        60, 0.5, what=f"{n}'s live gauges")  # fmt: skip
        assert blocks(live) == {BLOCKS[n]}, live
    pushed = time.monotonic()
    for n in NODES:
        atomic_write(sysd.node(n).merged / CONF, site[n] + BAD, mode=0o644)
    for n in NODES:
        wait_for(lambda n=n: value(samples(sysd, n, "imexctl-live.prom"), "imexctl_live_config_invalid") == 1,
                 60, 0.5, what=f"{n}'s live gauges to say config_invalid")  # fmt: skip
    took = time.monotonic() - pushed
    assert took < 30, f"{took:.1f} s: more than two refreshes of 15 s"
    # the timer goes on starting the service that failed: the file keeps being written
    first = value(samples(sysd, "node1", "imexctl-live.prom"), "imexctl_live_refresh_timestamp_seconds") or 0
    wait_for(lambda: (value(samples(sysd, "node1", "imexctl-live.prom"), "imexctl_live_refresh_timestamp_seconds")
                      or 0) > first, 45, 0.5, what="node1's next refresh of the failing service")  # fmt: skip
    job = sbatch(sysd, "true", NODES)
    for n in NODES:
        wait_for(lambda n=n: value(samples(sysd, n, "imexctl.prom"), "imexctl_hook_runs_total", hook="prolog",
                                   outcome="failed", error_code="config_invalid"),
                 90, 0.5, what=f"{n}'s prolog of job {job} to be counted")  # fmt: skip
    # Slurm shows the hooks' own reason with the file and line, and imexctl drains folds the trays by block
    shown = wait_for(lambda: _reasons(sysd, every=True), 60, 0.5, what="both trays drained with the hooks' reason")
    assert shown is not None
    for n in NODES:
        assert shown[n].startswith(f"imex:config_invalid {n} job {job}: /{CONF}:"), shown
    view = _drains(sysd)
    groups = [(g["label"], g["block"], g["trays"]) for g in view["groups"]]
    assert groups == [("imex:config_invalid", BLOCKS[n], 1) for n in NODES], view
    scrape = {n: {f: samples(sysd, n, f) for f in FILES} for n in NODES}
    for n, files in scrape.items():
        assert all(blocks(found) == {BLOCKS[n]} for found in files.values() if found), (n, files)
        assert value(files["imexctl-live.prom"], "imexctl_live_domain_state", state="none") is None, "nothing asked"
    service = sysd.node("node1").show("imexctl-metrics.service", "Result", "ExecMainStatus")
    assert service == {"Result": "exit-code", "ExecMainStatus": "78"}, service

    series = [entry for n in NODES for found in scrape[n].values() for entry in input_series(n, found)]
    promtool_test(promtool, tmp_path, series, {
        "ImexctlConfigInvalid": [config_invalid(n) for n in NODES],
        "ImexctlPrologFailures": [prolog_failed(n) for n in NODES],
    })  # fmt: skip
    fired = [
        {
            "labels": {"alertname": "ImexctlConfigInvalid", "severity": "critical", "instance": n, "block": BLOCKS[n]},
            "annotations": {"summary": f"the imexctl config file on {n} does not load: every prolog there fails"},
        }
        for n in NODES
    ]
    assert am.groups(alertmanager, fired) == {BLOCKS[n]: [n] for n in NODES}


def _reasons(lab: SystemdLab, *, every: bool = False) -> dict[str, str] | None:
    """Each drained node's reason, as ``sinfo -R`` prints it whole (``%E``); ``every``: None until both have one."""
    out = lab.run(["sinfo", "-h", "-R", "-o", "%n|%E"]).stdout
    found = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
    return None if every and not all(n in found for n in NODES) else found


def _drains(lab: SystemdLab) -> dict[str, Any]:
    """``imexctl drains --json`` on node1 as an admin runs it, with a config of its own naming the topology."""
    m = lab.node("node1")
    login = "etc/imexctl/login.conf"
    atomic_write(m.merged / login, f"[paths]\ntopology_file = {TOPOLOGY}\n", mode=0o644)
    try:
        res = m.exec(["/opt/imexctl/bin/imexctl", "--config", f"/{login}", "drains", "--json"])
    finally:
        (m.merged / login).unlink()
    return dict(json.loads(res.stdout)["data"])


def test_a_tray_just_booted_labels_its_first_failure_with_its_block(sysd: SystemdLab, site: dict[str, str]) -> None:
    """node1 reboots (its totals in /run are gone, its textfile directory emptied, no live-gauge timer); its first
    prolog fails before any domain (the daemon dies at start): that failure is counted with block r01 from the
    topology file, with no domain on the tray."""
    m = sysd.node("node1")
    m.exec(["sh", "-c", f"rm -f {TEXTFILE_DIR}/*.prom"])
    sysd.reboot("node1", clean=True)
    sysd.wait_idle(timeout=120)
    sysd.set_faults("node1", "crash_after=0")
    job = sbatch(sysd, "true", ["node1"])
    found = wait_for(
        lambda: (g := samples(sysd, "node1", "imexctl.prom"))
        and any(name == "imexctl_hook_runs_total" and ("outcome", "failed") in labels for name, labels in g)
        and g,
        90, 0.5, what=f"node1's first prolog (job {job}) to be counted",
    )  # fmt: skip
    failed = [dict(labels) for (name, labels), v in found.items()
              if name == "imexctl_hook_runs_total" and ("outcome", "failed") in labels and v == 1]  # fmt: skip
    assert [(f["hook"], f["block"]) for f in failed] == [("prolog", "r01")], found
    assert value(found, "imexctl_domain_owner_job") == 0
    assert blocks(found) == {"r01"}
