"""The live gauges: this tray's IMEX domain as it is now, for node_exporter's textfile collector (docs/metrics.md).

The hooks' file (``imexctl.prom``, :mod:`imexctl.hooks.metrics`) says what the
last prolog, epilog or cleanup saw; between two hooks it does not change, so a
daemon that dies mid-job or a peer that drops away shows only at the epilog.
``imexctl status --textfile`` (run every 15 s by ``imexctl-metrics.timer``)
asks now: the owner job's daemon (``nvidia-imex-ctl -N -j``, bounded by
``[readiness] ctl_timeout_s``), whether a set-up job's daemon is gone, and what
is left of jobs that no longer run here; it replaces ``imexctl-live.prom``
atomically.  Every name begins with ``imexctl_live_``: node_exporter refuses a
metric that two files of its directory both hold with the same labels
(prometheus/node_exporter #1462, #1885), so none of them is a name of the
hooks' file.  ``imexctl status --prometheus`` prints the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from imexctl.config.settings import Settings
from imexctl.hooks import metrics
from imexctl.platform import Record

__all__ = ["FILE_NAME", "LIVE_METRICS", "STATES", "Live", "render", "textfile"]

FILE_NAME: Final = "imexctl-live.prom"
#: values of the ``state`` label of imexctl_live_domain_state
STATES: Final = ("none", "up", "degraded", "down", "unknown")

#: name -> (type, help); docs/metrics.md lists exactly these (tests/commands/test_live.py)
LIVE_METRICS: Final[dict[str, tuple[str, str]]] = {
    "imexctl_live_domain_state": ("gauge", "This tray's IMEX domain now: 1 for its state, 0 for the others."),
    "imexctl_live_domain_peers": ("gauge", "Other trays in this tray's IMEX domain now (0 without a domain)."),
    "imexctl_live_domain_peers_connected": ("gauge", "Peers this tray's daemon is connected to now, where asked."),
    "imexctl_live_domain_owner_job": ("gauge", "The job whose domain this tray runs now (0: none)."),
    "imexctl_live_daemon_lost": ("gauge", "Set-up domains whose IMEX daemon has ended while their job runs on."),
    "imexctl_live_stale": ("gauge", "Leftovers of jobs that no longer run here, by kind (job, channel)."),
    "imexctl_live_refresh_timestamp_seconds": ("gauge", "When these gauges were last refreshed (Unix time)."),
}


class Live(Record):
    """This tray now: its domain, lost daemons, leftovers and block (``imexctl status`` reads them)."""

    domain: metrics.Domain
    lost: int = 0
    stale_jobs: int = 0
    stale_channels: int = 0
    block: str = ""


def _head(name: str) -> list[str]:
    kind, text = LIVE_METRICS[name]
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


def render(live: Live, now: float) -> str:
    """The whole text of ``imexctl-live.prom``: every metric of :data:`LIVE_METRICS`, each series with ``block``."""
    d = live.domain
    state = d.state if d.state in STATES else "unknown"
    lines = _head("imexctl_live_domain_state")
    lines += [f'imexctl_live_domain_state{{state="{s}"}} {int(s == state)}' for s in STATES]
    lines += [*_head("imexctl_live_domain_peers"), f"imexctl_live_domain_peers {d.peers}"]
    lines += _head("imexctl_live_domain_peers_connected")
    if d.connected is not None:
        lines.append(f"imexctl_live_domain_peers_connected {d.connected}")
    lines += [*_head("imexctl_live_domain_owner_job"), f"imexctl_live_domain_owner_job {d.owner_job}"]
    lines += [*_head("imexctl_live_daemon_lost"), f"imexctl_live_daemon_lost {live.lost}"]
    lines += _head("imexctl_live_stale")
    lines += [f'imexctl_live_stale{{kind="job"}} {live.stale_jobs}']
    lines += [f'imexctl_live_stale{{kind="channel"}} {live.stale_channels}']
    lines += _head("imexctl_live_refresh_timestamp_seconds")
    lines += [f"imexctl_live_refresh_timestamp_seconds {round(now, 3)!r}"]
    return "\n".join(metrics.with_block(lines, live.block)) + "\n"


def textfile(settings: Settings) -> Path | None:
    """``<textfile_dir>/imexctl-live.prom`` under ``[paths] root``, or None when metrics are off."""
    directory = settings.metrics.textfile_dir
    return settings.paths.root / directory.lstrip("/") / FILE_NAME if directory else None
