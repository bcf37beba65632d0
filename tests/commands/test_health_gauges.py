"""imexctl health's findings as gauges (issue 42): imexctl-health.prom beside the hooks' and the live files, read
back with prometheus_client's parser; a config file that does not load is written where the hooks then count."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl import cli
from imexctl.commands import health
from imexctl.hooks import metrics
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost

DOCS = Path(__file__).resolve().parents[2] / "docs"
TEXTFILE_DIR = "/var/lib/node_exporter"


@pytest.fixture
def tray(root: Path, host: FakeHost) -> Path:
    """A tray under ``root`` with metrics on and a topology file naming its block r01; slurmctld knows gb01."""
    (root / TEXTFILE_DIR.lstrip("/")).mkdir(parents=True)
    (root / "etc/slurm").mkdir(parents=True)
    (root / "etc/slurm/topology.conf").write_text("BlockName=r01 Nodes=gb[01-18]\n")
    write_config(root, {
        "paths": {"root": str(root), "topology_file": "/etc/slurm/topology.conf"},
        "daemon": {"backend": "exec"},
        "policy": {"fabric": "none"},
        "metrics": {"textfile_dir": TEXTFILE_DIR},
    })  # fmt: skip
    host.slurm_nodes["gb01"] = {"state": "IDLE"}
    return root


def run(tray: Path, host: FakeHost, *args: str) -> int:
    env = {"SLURMD_NODENAME": "gb01", "SLURM_NODE_IS_HEALTHY": "yes"}
    return cli.main(["--config", str(tray / "imexctl.conf"), "health", *args], env=env, host=host, gpu=FakeGpu())


def gauges(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample, labels) -> value of imexctl-health.prom; labels include block."""
    text = (directory / health.GAUGES_FILE).read_text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def findings(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """code -> value of imexctl_health_finding."""
    return {dict(labels)["code"]: v for (name, labels), v in found.items() if name == "imexctl_health_finding"}


def test_a_healthy_tray_reads_zero_for_every_code(tray: Path, host: FakeHost) -> None:
    """Every code of health.CODES is a series, 0 on a healthy tray; when it ran; each with the tray's block."""
    host.now = 100.0
    assert run(tray, host) == 0
    found = gauges(tray / TEXTFILE_DIR.lstrip("/"))
    assert findings(found) == dict.fromkeys(health.CODES, 0.0)
    assert found[("imexctl_health_run_timestamp_seconds", (("block", "r01"),))] == host.time()
    assert {dict(labels).get("block") for _, labels in found} == {"r01"}


def test_a_finding_is_one_for_its_code(tray: Path, host: FakeHost) -> None:
    """The stock unit running: stock_unit reads 1, every other code 0; once it is stopped, 0 again."""
    host.units["nvidia-imex.service"] = {"LoadState": "loaded", "ActiveState": "active"}
    assert run(tray, host, "--check-only") == 1
    assert findings(gauges(tray / TEXTFILE_DIR.lstrip("/"))) == {c: float(c == "stock_unit") for c in health.CODES}
    host.units["nvidia-imex.service"] = {"LoadState": "masked", "ActiveState": "inactive"}
    assert run(tray, host, "--check-only") == 0
    assert set(findings(gauges(tray / TEXTFILE_DIR.lstrip("/"))).values()) == {0.0}


def test_a_config_that_does_not_load_is_a_finding_in_the_fallback(
    tray: Path, host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a hook counted in the directory (block r01 remembered), the config breaks: health's config_invalid
    reads 1 in that same directory, with the remembered block."""
    monkeypatch.setattr(metrics, "FALLBACK_ROOT", str(tray))
    assert cli.main(["--config", str(tray / "imexctl.conf"), "epilog"], env={
        "SLURMD_NODENAME": "gb01", "SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "u"
    }, host=host, gpu=FakeGpu()) == 0  # fmt: skip
    (tray / "imexctl.conf").write_text("[readiness]\ndeadline_s = soon\n")
    assert run(tray, host, "--check-only") == 1
    found = gauges(tray / TEXTFILE_DIR.lstrip("/"))
    assert findings(found) == {c: float(c == "config_invalid") for c in health.CODES}
    assert {dict(labels).get("block") for _, labels in found} == {"r01"}


def test_not_root_writes_nothing(tray: Path, host: FakeHost) -> None:
    """A check run by another user judges what it may and writes no file into root's directory."""
    host.euid_value = 1000
    run(tray, host, "--check-only")
    assert not (tray / TEXTFILE_DIR.lstrip("/") / health.GAUGES_FILE).exists()


def test_docs_metrics_page_lists_health_gauges() -> None:
    """docs/metrics.md has one table row per health gauge with its type."""
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(imexctl_health_[a-z_]+)` \| (\w+) \|", text, flags=re.MULTILINE))
    assert rows == {name: kind for name, (kind, _help) in health.GAUGES.items()}
