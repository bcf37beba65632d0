"""metrics: the Prometheus text file after each hook and cleanup, read back with prometheus_client's own parser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.hooks import metrics
from imexctl.hooks.results import Action, CleanupResult
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, job_env

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def prom_dir(root: Path) -> Path:
    path = root / "var/lib/node_exporter"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def cfg(make_settings: Callable[..., Settings], prom_dir: Path) -> str:
    """A config with metrics on: [metrics] textfile_dir (under [paths] root)."""
    return str(make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"}).source)


def run(cfg: str, *argv: str, host: FakeHost, env: dict[str, str] | None = None, gpu: Any = None) -> int:
    return main(["--config", cfg, *argv], env=job_env() if env is None else env, host=host, gpu=gpu or FakeGpu())


def families(prom_dir: Path) -> dict[str, Any]:
    """The text file as prometheus_client parses it: family name -> family."""
    text = (prom_dir / metrics.FILE_NAME).read_text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, Any], name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with exactly these labels, the tray's ``block`` aside."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name and {k: v for k, v in s.labels.items() if k != "block"} == labels:
                return float(s.value)
    raise AssertionError(f"no sample {name}{labels}")


def test_prolog_writes_a_file_that_prometheus_client_parses(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """After a prolog the file parses, counts one ok run, observes its duration and shows the domain up."""
    host.now = 1000.0
    assert run(cfg, "prolog", host=host) == 0
    fams = families(prom_dir)
    assert {f.name: f.type for f in fams.values()} == {
        name.removesuffix("_total"): kind for name, (kind, _help) in metrics.METRICS.items()
    }
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="ok", error_code="none") == 1
    assert sample(fams, "imexctl_hook_duration_seconds_count", hook="prolog") == 1
    assert sample(fams, "imexctl_time_to_ready_seconds_count", hook="prolog") == 1
    assert sample(fams, "imexctl_domain_state", state="up") == 1
    assert sample(fams, "imexctl_domain_state", state="none") == 0
    assert sample(fams, "imexctl_domain_peers") == 1
    assert sample(fams, "imexctl_domain_peers_connected") == 1
    assert sample(fams, "imexctl_domain_owner_job") == 42


def test_counters_survive_across_runs(cfg: str, host: FakeHost, prom_dir: Path, root: Path) -> None:
    """Each run adds to the totals kept in run_dir, and the epilog resets the gauges."""
    for job in (42, 43):
        assert run(cfg, "prolog", host=host, env=job_env(job_id=job)) == 0
        assert run(cfg, "epilog", host=host, env=job_env(job_id=job)) == 0
    host.ready_after = 10**6
    assert run(cfg, "prolog", host=host, env=job_env(job_id=44)) == 75
    fams = families(prom_dir)
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="ok", error_code="none") == 2
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="failed", error_code="not_ready") == 1
    assert sample(fams, "imexctl_hook_runs_total", hook="epilog", outcome="ok", error_code="none") == 2
    assert sample(fams, "imexctl_hook_duration_seconds_count", hook="prolog") == 3
    assert sample(fams, "imexctl_hook_duration_seconds_bucket", hook="prolog", le="+Inf") == 3
    assert sample(fams, "imexctl_time_to_ready_seconds_count", hook="prolog") == 2
    assert sample(fams, "imexctl_domain_state", state="none") == 1
    assert sample(fams, "imexctl_domain_owner_job") == 0
    assert json.loads((root / "run/imexctl/metrics.json").read_text())["hook_runs"]


def test_a_busy_stop_is_counted(make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path) -> None:
    """imexctl_daemon_busy_stops_total counts each daemon the epilog stopped while the job's user still held the
    NVIDIA driver: 0 for an epilog whose job's processes were gone, 1 after one that was not."""
    cfg = str(make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"}, daemon={"process_wait_s": 1}).source)
    for job, busy in ((42, False), (43, True)):
        assert run(cfg, "prolog", host=host, env=job_env(job_id=job)) == 0
        stuck = host.add_process(["/home/alice/train"], uid=1000, driver=True) if busy else None
        assert run(cfg, "epilog", host=host, env=job_env(job_id=job)) == 0
        assert sample(families(prom_dir), "imexctl_daemon_busy_stops_total") == float(busy)
        if stuck is not None:
            host.send_signal(stuck, 9)


def test_histogram_buckets_are_cumulative(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """Each bucket counts the runs up to its bound; the sum is the total time."""
    host.ready_after = 3  # two pauses of poll_initial_s and its double: about 0.09 s of fake time
    assert run(cfg, "prolog", host=host) == 0
    fams = families(prom_dir)
    total = sample(fams, "imexctl_hook_duration_seconds_sum", hook="prolog")
    counts = [sample(fams, "imexctl_hook_duration_seconds_bucket", hook="prolog", le=str(b)) for b in metrics.BUCKETS]
    assert counts == [float(total <= b) for b in metrics.BUCKETS]
    assert 0.05 < total < 1


def test_skipped_job_counts_as_skipped(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """A prolog that skips the job (a one-tray job, no NVLink fabric) counts as skipped, with no time to ready."""
    assert run(cfg, "prolog", host=host, env=job_env(nodelist="gb01"), gpu=FakeGpu(infos=[None])) == 0
    fams = families(prom_dir)
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="skipped", error_code="none") == 1
    assert not list(fams["imexctl_time_to_ready_seconds"].samples)


def test_a_job_whose_sharing_slurmctld_did_not_tell_is_counted(cfg: str, host: FakeHost, prom_dir: Path,
                                                                 root: Path) -> None:  # fmt: skip
    """Slurm 22.05, squeue never answers: the prolog skips the job and imexctl_sharing_unknown_total counts it."""
    (root / "slurm.conf").write_text("ClusterName=x\n")
    env = job_env(SLURM_CONF=str(root / "slurm.conf"), SLURM_JOB_OVERSUBSCRIBE=None)  # 22.05 does not set it
    assert run(cfg, "prolog", host=host, env=env) == 0
    host.slurm_jobs[43] = SlurmJob(43, "CONFIGURING", "gb[01-02]", oversubscribe="OK")
    assert run(cfg, "prolog", host=host, env=env | {"SLURM_JOB_ID": "43"}) == 0
    fams = families(prom_dir)
    assert sample(fams, "imexctl_sharing_unknown_total") == 1
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="skipped", error_code="none") == 2


def test_cleanup_counts_its_actions(cfg: str, host: FakeHost, prom_dir: Path, root: Path) -> None:
    """cleanup counts one run and each action by kind; --dry-run counts nothing."""
    assert run(cfg, "prolog", host=host) == 0
    # --force: without a step or an epilog the set-up job may still run, and plain cleanup would leave it
    assert run(cfg, "cleanup", "--dry-run", "--force", host=host, env={}) == 0
    assert "imexctl_cleanup_runs_total{" not in (prom_dir / metrics.FILE_NAME).read_text()
    assert run(cfg, "cleanup", "--force", host=host, env={}) == 0
    fams = families(prom_dir)
    assert sample(fams, "imexctl_cleanup_runs_total", outcome="ok") == 1
    assert sample(fams, "imexctl_cleanup_actions_total", action="stop_daemon") == 1
    assert sample(fams, "imexctl_cleanup_actions_total", action="remove_job_dir") == 1
    assert sample(fams, "imexctl_last_run_timestamp_seconds", command="cleanup") > 1e9


KILLED = ("stop_daemon", "kill_daemon")
CHANNEL = "/dev/nvidia-caps-imex-channels/channel4"


@pytest.mark.parametrize(
    ("action", "labels"),
    [
        (Action("stop_daemon", "4"), ("stop_daemon",)),
        (Action("stop_daemon", "4", "SIGKILL to pid 77", killed=True), KILLED),
        (
            Action(
                "stop_daemon", "4", "imexctl-imex@4.service: systemd sent SIGKILL after the stop timeout", killed=True
            ),
            KILLED,
        ),
        (Action("stop_daemon", "4", "stop failed: busy"), ("stop_daemon",)),
        (Action("remove_channel", CHANNEL), ("remove_channel",)),
        (Action("remove_stray_channel", CHANNEL), ("remove_stray_channel",)),
        (Action("remove_job_dir", "/run/imexctl/jobs/4"), ("remove_job_dir",)),
        (Action("remove_note", "4"), ("remove_job_dir",)),
        (Action("failed", "/dev/x", "busy"), ("failed",)),
        (Action("something_new", "x"), ("other",)),
    ],
)
def test_cleanup_action_kinds(action: Action, labels: tuple[str, ...]) -> None:
    """Each of teardown's actions counts under its kind's label; a stop that needed SIGKILL under two."""
    assert metrics.run_of("cleanup", CleanupResult(False, (action,)), None, 0.0, "domain").actions == labels


def test_metrics_failure_never_fails_the_hook(
    make_settings: Callable[..., Settings], host: FakeHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """A textfile_dir that does not exist is a warning (metrics.failed); the prolog still exits 0."""
    cfg = str(make_settings(metrics={"textfile_dir": "/no/such/dir"}).source)
    assert run(cfg, "prolog", host=host, env=job_env()) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line["event"] == "metrics.failed"]
    assert failed and "No such file or directory" in failed[0]["reason"]


def test_metrics_off_writes_nothing(make_settings: Callable[..., Settings], host: FakeHost, root: Path) -> None:
    """With the default (empty) textfile_dir no state or text file is written."""
    cfg = str(make_settings().source)
    assert run(cfg, "prolog", host=host) == 0
    assert not (root / "run/imexctl/metrics.json").exists()
    assert not list(root.rglob("*.prom"))


def test_corrupt_state_restarts_the_counters(cfg: str, host: FakeHost, prom_dir: Path, root: Path) -> None:
    """An unreadable metrics.json starts the totals again instead of failing."""
    (root / "run/imexctl").mkdir(parents=True)
    (root / "run/imexctl/metrics.json").write_text("{not json")
    assert run(cfg, "epilog", host=host) == 0
    assert sample(families(prom_dir), "imexctl_hook_runs_total", hook="epilog", outcome="ok", error_code="none") == 1


def test_label_values_are_escaped() -> None:
    """Quotes, backslashes and newlines in a label value survive the parser."""
    totals = {"hook_runs": {'prolog\tfailed\tod"d\\\ncode': 1}}
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render(totals))}
    assert fams["imexctl_hook_runs"].samples[0].labels["error_code"] == 'od"d\\\ncode'


def test_every_series_carries_the_trays_block(cfg: str, host: FakeHost, prom_dir: Path) -> None:
    """After a prolog every sample of the file has the tray's block: here the name made from its NVML key."""
    assert run(cfg, "prolog", host=host) == 0
    samples = [s for fam in families(prom_dir).values() for s in fam.samples]
    assert samples and {s.labels.get("block") for s in samples} == {"nvl-11111111-7"}


def test_the_block_comes_from_the_topology_and_stays_after_the_epilog(
    make_settings: Callable[..., Settings], host: FakeHost, root: Path, prom_dir: Path
) -> None:
    """With a topology file the block is the file's name for the tray's block; the epilog (which reads no
    topology) keeps it, so a tray's series keep one label set."""
    topo = root / "etc/slurm/topology.conf"
    topo.parent.mkdir(parents=True)
    topo.write_text("BlockName=r01 Nodes=gb[01-02]\n")
    cfg = make_settings(
        metrics={"textfile_dir": "/var/lib/node_exporter"}, paths={"topology_file": "/etc/slurm/topology.conf"}
    )
    for hook in ("prolog", "epilog"):
        assert run(str(cfg.source), hook, host=host) == 0
        blocks = {s.labels.get("block") for fam in families(prom_dir).values() for s in fam.samples}
        assert blocks == {"r01"}, hook


def test_without_a_block_the_series_have_no_block_label(
    make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path
) -> None:
    """[policy] fabric = none and no topology: nothing names the block, and no sample gets an empty label."""
    cfg = make_settings(metrics={"textfile_dir": "/var/lib/node_exporter"}, policy={"fabric": "none"})
    assert run(str(cfg.source), "prolog", host=host) == 0
    assert "block=" not in (prom_dir / metrics.FILE_NAME).read_text()


def test_docs_metrics_page_lists_every_metric_with_its_type() -> None:
    """docs/metrics.md has one table row per metric (the hooks', the live and health's ones): name, type; and names
    no other."""
    from imexctl.commands.health import GAUGES
    from imexctl.commands.live import LIVE_METRICS

    every = {**metrics.METRICS, **LIVE_METRICS, **GAUGES}
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(imexctl_[a-z_]+)` \| (\w+) \|", text, flags=re.MULTILINE)
    assert dict(rows) == {name: kind for name, (kind, _help) in every.items()}
    assert len(rows) == len(every)
    mentioned = set(re.findall(r"\bimexctl_[a-z_]+[a-z]\b", text)) - {"imexctl_result_version"}
    known = set(every) | {f"{n}_{s}" for n in metrics.METRICS for s in ("bucket", "sum", "count")}
    assert mentioned <= known, sorted(mentioned - known)


def test_hooks_do_not_import_metrics_when_off() -> None:
    """The hook path imports neither imexctl.hooks.metrics nor prometheus_client nor doctor code at start-up."""
    code = (
        "import sys, imexctl.cli, imexctl.hooks.prolog, imexctl.hooks.teardown;"
        "print(sorted(m for m in sys.modules if m.startswith(('imexctl.hooks.metrics', 'prometheus_client',"
        " 'imexctl.doctor', 'imexctl.cli.reference', 'imexctl.cli.parser'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


# ---- a config file that does not load, and the block before any domain (issue 42)

BAD_CONFIG = "[policy]\njobs = everything\n"


@pytest.fixture
def fallback_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fallback's built-in paths under the test's root (production: /)."""
    monkeypatch.setattr(metrics, "FALLBACK_ROOT", str(root))
    return root


def topology_cfg(
    make_settings: Callable[..., Settings], root: Path, textfile_dir: str = "/var/lib/node_exporter"
) -> str:
    """Metrics on, and a topology file that puts gb01 and gb02 in block r01."""
    topo = root / "etc/slurm/topology.conf"
    topo.parent.mkdir(parents=True, exist_ok=True)
    topo.write_text("BlockName=r01 Nodes=gb[01-02]\n")
    cfg = make_settings(metrics={"textfile_dir": textfile_dir}, paths={"topology_file": "/etc/slurm/topology.conf"})
    return str(cfg.source)


def break_config(cfg: str) -> None:
    """The config file, replaced by one whose value does not validate (root's, 0644)."""
    Path(cfg).write_text(BAD_CONFIG)


def test_a_config_that_does_not_load_is_counted_where_the_last_run_counted(
    make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path, fallback_root: Path
) -> None:
    """A bad config pushed to a working tray: its prologs and epilogs exit 78 and are counted as failed with
    config_invalid in the directory the last good run wrote (not the documented default), with the block that run
    learned; the earlier counts go on."""
    cfg = topology_cfg(make_settings, fallback_root)
    assert run(cfg, "epilog", host=host) == 0
    break_config(cfg)
    assert run(cfg, "prolog", host=host) == 78
    assert run(cfg, "prolog", host=host) == 78
    assert run(cfg, "epilog", host=host) == 78
    fams = families(prom_dir)
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="failed", error_code="config_invalid") == 2
    assert sample(fams, "imexctl_hook_runs_total", hook="epilog", outcome="failed", error_code="config_invalid") == 1
    assert sample(fams, "imexctl_hook_runs_total", hook="epilog", outcome="ok", error_code="none") == 1
    assert {s.labels.get("block") for f in fams.values() for s in f.samples} == {"r01"}
    assert not (fallback_root / metrics.FALLBACK_TEXTFILE_DIR.lstrip("/")).exists()


def test_with_nothing_remembered_the_fallback_is_the_documented_directory(
    root: Path, host: FakeHost, fallback_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a reboot with a config that never loaded: a tray without FALLBACK_TEXTFILE_DIR never had metrics,
    and counts nothing (exit 78, no warning); where that directory exists, the failure is counted there."""
    cfg = root / "imexctl.conf"
    cfg.write_text(BAD_CONFIG)
    cfg.chmod(0o644)
    assert run(str(cfg), "prolog", host=host) == 78
    assert '"metrics.failed"' not in capsys.readouterr().err
    assert not list(root.rglob("*.prom")) and not (root / "run").exists()
    default = root / metrics.FALLBACK_TEXTFILE_DIR.lstrip("/")
    default.mkdir(parents=True)
    assert run(str(cfg), "prolog", host=host) == 78
    fams = families(default)
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="failed", error_code="config_invalid") == 1
    assert "block=" not in (default / metrics.FILE_NAME).read_text()


def test_a_remembered_directory_that_is_gone_is_a_warning(
    make_settings: Callable[..., Settings],
    host: FakeHost,
    prom_dir: Path,
    fallback_root: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The totals remember a directory that no longer exists: the hook exits 78 all the same, and says
    metrics.failed on stderr (slurmd's log) with the reason."""
    cfg = topology_cfg(make_settings, fallback_root)
    assert run(cfg, "epilog", host=host) == 0
    break_config(cfg)
    (prom_dir / metrics.FILE_NAME).unlink()
    prom_dir.rmdir()
    capsys.readouterr()
    assert run(cfg, "prolog", host=host) == 78
    failed = [json.loads(x) for x in capsys.readouterr().err.splitlines() if '"metrics.failed"' in x]
    assert len(failed) == 1 and "No such file or directory" in failed[0]["reason"], failed


def test_the_first_failure_after_a_boot_carries_the_block_of_the_topology(
    make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path, root: Path
) -> None:
    """A tray just booted (no totals) whose first prolog fails before any domain (its fabric registration
    failed): the failure is counted with the block the topology file gives the tray, without a domain."""
    from imexctl.gpu.fabric import FabricInfo

    cfg = topology_cfg(make_settings, root)
    broken = FakeGpu([FabricInfo(i, b"\x00" * 16, 0, 3, 23) for i in range(4)])
    assert run(cfg, "prolog", host=host, gpu=broken) == 69
    fams = families(prom_dir)
    assert sample(fams, "imexctl_hook_runs_total", hook="prolog", outcome="failed", error_code="gpu_failed") == 1
    assert sample(fams, "imexctl_domain_owner_job") == 0
    assert {s.labels.get("block") for f in fams.values() for s in f.samples} == {"r01"}


def test_the_totals_remember_the_textfile_directory_and_the_block(
    make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path, root: Path
) -> None:
    """What the fallback reads back: the last run's textfile directory and block."""
    cfg = topology_cfg(make_settings, root)
    assert run(cfg, "epilog", host=host) == 0
    assert metrics.remembered(make_settings()) == ("/var/lib/node_exporter", "r01")


def test_the_build_info_names_the_packages_whole_version(
    cfg: str, host: FakeHost, prom_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a package's version directory, imexctl_build_info's version is the package's whole version
    (a rebuild of the same upstream version differs, for ImexctlVersionSkew); outside them, imexctl's own."""
    from imexctl import __version__
    from imexctl.platform import versions

    assert run(cfg, "epilog", host=host) == 0
    assert sample(families(prom_dir), "imexctl_build_info", version=__version__) == 1
    monkeypatch.setattr(versions, "read", lambda: versions.Versions(running=versions.Build("0.1.0-3", "abc123")))
    assert run(cfg, "epilog", host=host) == 0
    assert sample(families(prom_dir), "imexctl_build_info", version="0.1.0-3") == 1


def test_totals_that_others_may_write_remember_nothing(
    make_settings: Callable[..., Settings], host: FakeHost, prom_dir: Path, root: Path
) -> None:
    """The remembered directory decides where root writes: totals writable by others keep none."""
    cfg = topology_cfg(make_settings, root)
    assert run(cfg, "epilog", host=host) == 0
    (root / "run/imexctl/metrics.json").chmod(0o666)
    assert metrics.remembered(make_settings()) == ("", "")
