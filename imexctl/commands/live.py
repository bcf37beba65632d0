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

A refresh whose config file does not load still writes the file, where the
hooks then count their failures (``metrics.fallback``): it says
``imexctl_live_config_invalid 1`` and when, with the version and the block the
hooks' totals remember, so that the file never goes stale for a bad config
(:func:`write_unloaded`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from imexctl.config.settings import Settings
from imexctl.hooks import metrics
from imexctl.platform import Record
from imexctl.platform.versions import Pending

__all__ = ["FILE_NAME", "LIVE_METRICS", "STATES", "Live", "render", "render_unloaded", "textfile", "write_unloaded"]

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
    "imexctl_live_version_pending": (
        "gauge",
        "1 while the installed package's imexctl is not the version in use (its switch refused), else 0.",
    ),
    "imexctl_live_config_invalid": ("gauge", "1 when the config file did not load at the last refresh, else 0."),
    "imexctl_live_build_info": ("gauge", "The version of imexctl that refreshed these gauges, as a label; always 1."),
}


class Live(Record):
    """This tray now: its domain, lost daemons, leftovers and block (``imexctl status`` reads them)."""

    domain: metrics.Domain
    lost: int = 0
    stale_jobs: int = 0
    stale_channels: int = 0
    block: str = ""
    #: the package's version in use and one installed beside it (imexctl/platform/versions.py)
    version: tuple[Pending, ...] = ()


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
    lines += _version_lines(live.version)
    lines += _tail(now, invalid=False)
    return "\n".join(metrics.with_block(lines, live.block)) + "\n"


def _version_lines(samples: tuple[Pending, ...]) -> list[str]:
    """``imexctl_live_version_pending``: the version in use, the one installed and why (versions' own characters)."""
    name = "imexctl_live_version_pending"
    labels = ('active="{}",installed="{}",reason="{}"'.format(*s[:3]) for s in samples)
    return [*_head(name), *(f"{name}{{{text}}} {s.value}" for text, s in zip(labels, samples))]


#: the gauges every refresh writes, even one whose config file did not load (:func:`_tail`)
_ALWAYS: Final = ("imexctl_live_refresh_timestamp_seconds", "imexctl_live_config_invalid", "imexctl_live_build_info")


def render_unloaded(block: str, now: float) -> str:
    """The text of a refresh whose config file did not load: when, ``config_invalid`` 1 and the version.

    Every other gauge is left out (HELP and TYPE only): nothing about the
    tray's domain was asked.
    """
    lines = [line for name in LIVE_METRICS if name not in _ALWAYS for line in _head(name)]
    return "\n".join(metrics.with_block([*lines, *_tail(now, invalid=True)], block)) + "\n"


def _tail(now: float, *, invalid: bool) -> list[str]:
    """When, whether the config file loaded, and the version: what every refresh writes."""
    when, invalid_, build = _ALWAYS
    lines = [*_head(when), f"{when} {round(now, 3)!r}", *_head(invalid_), f"{invalid_} {int(invalid)}"]
    return [*lines, *_head(build), f'{build}{{version="{metrics.build_version()}"}} 1']


def textfile(settings: Settings) -> Path | None:
    """``<textfile_dir>/imexctl-live.prom`` under ``[paths] root``, or None when metrics are off."""
    directory = settings.metrics.textfile_dir
    return settings.paths.root / directory.lstrip("/") / FILE_NAME if directory else None


def write_unloaded(node: str, now: float) -> Path | None:
    """Write :func:`render_unloaded` into the fallback's directory (``metrics.fallback``); the file written.

    The block is the one the hooks' totals there remember.  None (nothing
    written) on a tray that never had metrics.

    Raises:
        OSError: the directory is missing or others may write it, or the file cannot be written.
    """
    from imexctl.platform.fsutil import atomic_write

    settings = metrics.fallback(node)
    target = textfile(settings) if settings is not None else None
    if settings is None or target is None:
        return None
    metrics.check_textfile_dir(target.parent)
    atomic_write(target, render_unloaded(metrics.remembered(settings)[1], now), mode=0o644)
    return target
