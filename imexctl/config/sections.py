"""The typed records the hooks' gates take, light enough for the fast tier: ``[policy]`` and this node's paths.

Every tier hands the gates (:mod:`imexctl.hooks.gate`) the same records: the
fast tier builds them from the config file it validated
(:mod:`imexctl.hooks.quick`), the settings (:mod:`imexctl.config.settings`)
hold them, and the prolog and the teardown pass them on.  No tier hands the
gates a dict of values by key.  Imports only :mod:`imexctl.platform.record`
(``collections``, which the interpreter's start has loaded).
"""

from __future__ import annotations

from imexctl.platform.record import Record

__all__ = ["NodePaths", "Policy"]


class Policy(Record):
    """``[policy]``: which jobs get a domain, channels, the NVML fabric check."""

    jobs: str
    partitions: tuple[str, ...]
    feature: str
    shared: str
    channels: str
    channel_mode: int
    channel_count: int
    fabric: str
    fabric_wait_s: float
    fabric_limited: str
    single_tray: str
    lost_daemon: str


class NodePaths(Record):
    """``[paths]`` for this node, as plain strings under ``root`` (``schema.node_paths``); '' for one not set.

    The gates' view of where things lie; :class:`imexctl.config.paths.Paths`
    holds the same as ``pathlib`` paths for the rest of the hooks.  The job's
    own user reads only some (the rest stay '').
    """

    root: str = ""
    run_dir: str = ""
    channel_dir: str = ""
    proc_devices: str = ""
    log_file: str = ""
    imex_log_file: str = ""
    hosts_file: str = ""
    topology_file: str = ""
    topology_map: str = ""
    nvidia_params: str = ""
