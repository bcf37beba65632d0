"""The live gauges (``imexctl status --textfile`` / ``--prometheus``): this tray's domain as it is now, in a file
of their own beside the hooks' one, read back with prometheus_client's parser (issue 35 item 1)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl import __version__
from imexctl.cli import main
from imexctl.commands import live
from imexctl.config.paths import JobDir
from imexctl.config.settings import Settings
from imexctl.hooks import metrics
from imexctl.hooks.state import mark_state
from tests.support.fakes import FakeGpu, FakeHost, domain_json, job_env

DOCS = Path(__file__).resolve().parents[2] / "docs"
NODE = {"SLURMD_NODENAME": "gb01"}


def run(cfg: str, *argv: str, host: FakeHost, env: dict[str, str] | None = None, gpu: Any = None) -> int:
    return main(["--config", cfg, *argv], env=job_env() if env is None else env, host=host, gpu=gpu or FakeGpu())


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels without block) -> value; every sample must carry one and the same block."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "block")))] = float(s.value)
    return out


def value(text: str, name: str, **labels: str) -> float:
    return parse(text)[(name, tuple(sorted(labels.items())))]


def refresh(cfg: str, host: FakeHost, prom_dir: Path, gpu: Any = None) -> str:
    assert run(cfg, "status", "--textfile", host=host, env=NODE, gpu=gpu) == 0
    return (prom_dir / live.FILE_NAME).read_text()


def test_live_names_never_collide_with_the_hooks_file() -> None:
    """node_exporter refuses a metric two files both hold (node_exporter #1462, #1885): no live name, nor any
    sample name it makes, is one of the hooks' file."""
    hooks = {f"{n}{suffix}" for n in metrics.METRICS for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    assert not set(live.LIVE_METRICS) & hooks
    assert all(n.startswith("imexctl_live_") for n in live.LIVE_METRICS)
    assert live.FILE_NAME != metrics.FILE_NAME and live.FILE_NAME.endswith(".prom")


def test_textfile_beside_the_hooks_file_parses_as_one_scrape(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """After a prolog and a refresh both files, read as node_exporter merges them, hold no family twice."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    text = refresh(cfg, host, prom_dir)
    merged = (prom_dir / metrics.FILE_NAME).read_text() + text
    names = [f.name for f in text_string_to_metric_families(merged)]
    assert len(names) == len(set(names))
    assert {f.name for f in text_string_to_metric_families(text)} == set(live.LIVE_METRICS)
    assert value(text, "imexctl_live_domain_state", state="up") == 1
    assert value(text, "imexctl_live_domain_owner_job") == 42
    assert value(text, "imexctl_live_domain_peers") == value(text, "imexctl_live_domain_peers_connected") == 1
    assert value(text, "imexctl_live_refresh_timestamp_seconds") == host.time()
    mode = (prom_dir / live.FILE_NAME).stat().st_mode & 0o777
    assert mode == 0o644 and sorted(p.name for p in prom_dir.iterdir()) == [live.FILE_NAME, metrics.FILE_NAME]


def test_connections_are_read_now_not_from_the_prolog(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """After a good prolog the hooks' file says every peer connected; when the peer's connection breaks, the live
    gauges say 0 connected and the domain degraded (what ImexctlDomainDegraded needs without blame_peers)."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    hooks_text = (prom_dir / metrics.FILE_NAME).read_text()
    assert value(hooks_text, "imexctl_domain_peers_connected") == 1
    host.domain = lambda hosts: (
        0,
        domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"}, conn_status="INVALID"),
    )
    text = refresh(cfg, host, prom_dir)
    assert value(text, "imexctl_live_domain_state", state="degraded") == 1
    assert value(text, "imexctl_live_domain_peers_connected") == 0 < value(text, "imexctl_live_domain_peers")
    assert (prom_dir / metrics.FILE_NAME).read_text() == hooks_text, "the hooks' file is the hooks' alone"
    ctl = [c for c in host.calls if "-N" in c]
    assert ctl and all("-c" in c and "-j" in c for c in ctl)


def test_a_daemon_that_dies_mid_job_is_lost_at_the_next_refresh(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """The job's daemon dies while the job runs: the next refresh counts it lost and the domain down; it is no
    leftover. The hooks' file learns it only at the epilog."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_daemon_lost") == 0
    for p in host.procs.values():
        p.alive = False
    text = refresh(cfg, host, prom_dir)
    assert value(text, "imexctl_live_daemon_lost") == 1
    assert value(text, "imexctl_live_domain_state", state="down") == 1
    assert ("imexctl_live_domain_peers_connected", ()) not in parse(text)
    assert value(text, "imexctl_live_stale", kind="job") == 0
    assert value((prom_dir / metrics.FILE_NAME).read_text(), "imexctl_daemon_lost_total") == 0


def test_a_prolog_in_flight_is_not_a_lost_daemon(cfg: str, host: FakeHost, root: Path, prom_dir: Path) -> None:
    """A job directory whose prolog has not finished (no set_up mark) and no daemon yet: nothing lost."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    for p in host.procs.values():
        p.alive = False
    state = root / "run/imexctl/jobs/42/state.json"
    state.write_text(re.sub(r'"set_up": [0-9.e+]+', '"set_up": 0.0', state.read_text()))
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_daemon_lost") == 0


def test_leftovers_of_ended_jobs_and_stray_channels_are_stale(
    cfg: str, host: FakeHost, root: Path, prom_dir: Path
) -> None:
    """A job whose epilog ran here (ended mark) but left its directory counts as a stale job."""
    assert run(cfg, "prolog", host=host) == 0
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_stale", kind="job") == 0
    assert mark_state(JobDir(42, root / "run/imexctl/jobs/42"), ended=1.0)
    text = refresh(cfg, host, prom_dir)
    assert value(text, "imexctl_live_stale", kind="job") == 1 and value(text, "imexctl_live_daemon_lost") == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a real channel device node (CAP_MKNOD)")
def test_no_channel_is_stale_while_a_running_jobs_state_cannot_be_read(
    cfg: str, host: FakeHost, root: Path, prom_dir: Path
) -> None:
    """Job 42 runs and its state.json is spoiled: it may claim any channel, so neither its own nor a stray one
    counts as stale (cleanup removes none then); once it reads again, only the stray does."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    stray = root / "dev/nvidia-caps-imex-channels/channel9"
    os.mknod(stray, stat.S_IFCHR | 0o600, os.makedev(234, 9))
    state = root / "run/imexctl/jobs/42/state.json"
    good = state.read_text()
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_stale", kind="channel") == 1
    state.write_text("{")
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_stale", kind="channel") == 0
    state.write_text(good)
    assert value(refresh(cfg, host, prom_dir), "imexctl_live_stale", kind="channel") == 1


def test_no_domain(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """An idle tray: state none, owner 0, no peers, nothing lost or stale."""
    text = refresh(cfg, host, prom_dir)
    assert value(text, "imexctl_live_domain_state", state="none") == 1
    assert value(text, "imexctl_live_domain_owner_job") == value(text, "imexctl_live_domain_peers") == 0
    assert value(text, "imexctl_live_daemon_lost") == value(text, "imexctl_live_stale", kind="job") == 0


def test_status_prometheus_prints_what_textfile_writes(
    cfg: str, host: FakeHost, prom_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status --prometheus`` prints the live gauges: redirected into the directory it no longer breaks
    node_exporter, since it holds none of the hooks' names."""
    assert run(cfg, "prolog", host=host) == 0
    host.running_jobs.add(42)
    capsys.readouterr()
    assert run(cfg, "status", "--prometheus", host=host, env=NODE) == 0
    assert capsys.readouterr().out == refresh(cfg, host, prom_dir)


def test_block_from_the_topology_file_without_asking_nvml(
    make_settings: Callable[..., Settings], host: FakeHost, root: Path, prom_dir: Path
) -> None:
    """With a topology file the block is the file's name for the tray's block, and NVML is not read; without one
    it is the name made from the NVML key (as the hooks' file has it)."""
    topo = root / "etc/slurm/topology.conf"
    topo.parent.mkdir(parents=True)
    topo.write_text("BlockName=r01 Nodes=gb[01-18]\n")
    with_topo = make_settings(
        metrics={"textfile_dir": "/var/lib/node_exporter"}, paths={"topology_file": "/etc/slurm/topology.conf"}
    )
    gpu = FakeGpu()
    text = refresh(str(with_topo.source), host, prom_dir, gpu=gpu)
    assert gpu.calls == 0
    blocks = {s.labels.get("block") for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert blocks == {"r01"}
    plain = make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"})
    text = refresh(str(plain.source), host, prom_dir, gpu=gpu)
    assert gpu.calls == 1
    blocks = {s.labels.get("block") for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert blocks == {"nvl-11111111-7"}


def test_textfile_without_textfile_dir_is_a_config_error(
    make_settings: Callable[..., Settings], host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """The timer's service fails loudly (exit 78, one plain line) when metrics are off: no file is guessed."""
    cfg = str(make_settings().source)
    assert run(cfg, "status", "--textfile", host=host, env=NODE) == 78
    assert capsys.readouterr().err == (
        "imexctl status: status --textfile: [metrics] textfile_dir is not set (docs/metrics.md) "
        "(config_invalid, exit 78)\n"
    )


def test_textfile_into_a_missing_directory_fails_and_leaves_nothing(
    make_settings: Callable[..., Settings], host: FakeHost, root: Path
) -> None:
    """A textfile_dir that does not exist: exit 71 (file_failed), no temporary file anywhere."""
    cfg = str(make_settings(metrics={"textfile_dir": "/no/such/dir"}).source)
    before = {str(p) for p in root.rglob("*")}
    assert run(cfg, "status", "--textfile", host=host, env=NODE) == 71
    assert {str(p) for p in root.rglob("*")} - before <= {str(root / "var"), str(root / "var/log")} | {
        str(p) for p in root.rglob("imexctl.log")
    }


def test_docs_metrics_page_lists_every_live_metric() -> None:
    """docs/metrics.md has one table row per live metric with its type."""
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(imexctl_live_[a-z_]+)` \| (\w+) \|", text, flags=re.MULTILINE))
    assert rows == {name: kind for name, (kind, _help) in live.LIVE_METRICS.items()}


def test_the_hooks_import_no_live_code() -> None:
    """The live gauges are an admin's command: nothing on the hook path imports them."""
    import subprocess
    import sys

    code = (
        "import sys; from imexctl.cli import main; from imexctl.hooks import prolog, teardown; "
        "print('imexctl.commands.live' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": str(DOCS.parent)})  # fmt: skip
    assert done.stdout.strip() == "False"


# ---- the version, and a config file that does not load (issue 42)

BAD_CONFIG = "[policy]\njobs = everything\n"


@pytest.fixture
def fallback_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fallback's built-in paths under the test's root (production: /)."""
    monkeypatch.setattr(metrics, "FALLBACK_ROOT", str(root))
    return root


def test_every_refresh_says_its_version_and_that_the_config_loaded(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """imexctl_live_build_info carries the version that refreshed; imexctl_live_config_invalid is 0."""
    text = refresh(cfg, host, prom_dir)
    assert value(text, "imexctl_live_build_info", version=__version__) == 1
    assert value(text, "imexctl_live_config_invalid") == 0


def test_a_config_that_does_not_load_is_written_as_such_not_left_stale(
    make_settings: Callable[..., Settings],
    host: FakeHost,
    root: Path,
    prom_dir: Path,
    fallback_root: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a good refresh (topology block r01), the config is broken: the next refresh still exits 78, and the
    file in the same directory now says config_invalid 1, when, the version and the block, and nothing of a domain
    that nobody asked."""
    topo = root / "etc/slurm/topology.conf"
    topo.parent.mkdir(parents=True)
    topo.write_text("BlockName=r01 Nodes=gb[01-18]\n")
    cfg = str(make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"},
                            paths={"topology_file": "/etc/slurm/topology.conf"}).source)  # fmt: skip
    host.now = 1000.0
    refresh(cfg, host, prom_dir)
    Path(cfg).write_text(BAD_CONFIG)
    host.now = 1015.0
    assert run(cfg, "status", "--textfile", host=host, env=NODE) == 78
    assert "config_invalid, exit 78" in capsys.readouterr().err
    text = (prom_dir / live.FILE_NAME).read_text()
    assert parse(text) == {
        ("imexctl_live_refresh_timestamp_seconds", ()): host.time(),
        ("imexctl_live_config_invalid", ()): 1.0,
        ("imexctl_live_build_info", (("version", __version__),)): 1.0,
    }
    assert {s.labels.get("block") for f in text_string_to_metric_families(text) for s in f.samples} == {"r01"}
    assert run(cfg, "status", "--prometheus", host=host, env=NODE) == 78
    assert capsys.readouterr().out == text


def test_a_refresh_keeps_the_block_for_the_hooks_first_failure(
    cfg: str, host: FakeHost, prom_dir: Path, root: Path
) -> None:
    """Without a topology file the refresh names the block from NVML and keeps it, with its directory, in the
    hooks' totals: an epilog on a tray that set up no domain since its boot counts with that block."""
    refresh(cfg, host, prom_dir)
    assert run(cfg, "epilog", host=host) == 0
    text = (prom_dir / metrics.FILE_NAME).read_text()
    assert {s.labels.get("block") for f in text_string_to_metric_families(text) for s in f.samples} == {
        "nvl-11111111-7"
    }
