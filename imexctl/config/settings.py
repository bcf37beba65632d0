"""imexctl configuration: the config file, read and validated by :mod:`imexctl.config.schema`, as typed settings.

Every key has a built-in default; a missing default config file means "all
defaults".  Unknown sections or keys, wrong types and a file that anyone but
root may write are errors that name file, section and key.  Reference:
docs/configuration.md (kept in sync with ``SCHEMA`` by tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imexctl.config import schema
from imexctl.config.paths import Paths
from imexctl.config.schema import NodePaths, Policy
from imexctl.platform import Record
from imexctl.platform.errors import ConfigError

__all__ = [
    "SECTIONS",
    "Auth",
    "Commands",
    "Containers",
    "Daemon",
    "Log",
    "Metrics",
    "PathsSection",
    "Policy",
    "Ports",
    "Readiness",
    "Resolve",
    "Settings",
    "Topology",
    "from_values",
    "load",
]

# One NamedTuple per section (immutable and typed, and a tenth of a frozen dataclass's cost to define at
# every start: docs/performance.md): the fields are schema.SCHEMA's keys, in its order, typed as parsed
# (tests/config/test_settings.py keeps the two equal).  SCHEMA, with the keys' defaults, parsers and
# comments, is the one source of docs/configuration.md's key tables (tests/test_docs.py).


class PathsSection(Record):
    """``[paths]`` as written: absolute paths, resolved under ``root`` into :class:`Paths`."""

    root: str
    run_dir: str
    channel_dir: str
    proc_devices: str
    log_file: str
    imex_log_file: str
    hosts_file: str
    topology_file: str
    topology_map: str
    nvidia_params: str


class Commands(Record):
    """``[commands]``: absolute paths of the programs imexctl runs."""

    nvidia_imex: str
    nvidia_imex_ctl: str
    systemctl: str
    scontrol: str
    squeue: str


class Daemon(Record):
    """``[daemon]``: how the job's daemon is started and stopped."""

    backend: str
    unit: str
    stock_unit: str
    start_timeout_s: float
    stop_timeout_s: float
    kill_grace_s: float
    lock_timeout_s: float
    process_wait_s: float


class Readiness(Record):
    """``[readiness]``: what "ready" means and how long to wait for it."""

    level: str
    deadline_s: float
    poll_initial_s: float
    poll_max_s: float
    ctl_timeout_s: float
    ctl_address: str
    blame_peers: str


class Slurm(Record):
    """``[slurm]``: what imexctl takes from slurm.conf and asks slurmctld."""

    cap_deadline: str
    timeout_margin_s: float
    check_cancelled: str
    ask_sharing: str
    query_timeout_s: float
    drain_reason: str
    het_jobs: str


class Ports(Record):
    """``[ports]``: the per-job port ranges."""

    server_port_range: tuple[int, int]
    cmd_port_range: tuple[int, int]


class Resolve(Record):
    """``[resolve]``: how tray names become addresses."""

    method: str


class Topology(Record):
    """``[topology]``: where the NVLink domains (Slurm blocks) come from (docs/topology.md)."""

    source: str
    yaml_topology: str


class Log(Record):
    """``[log]``: imexctl's own log."""

    level: str
    syslog: str


class Metrics(Record):
    """``[metrics]``: the Prometheus text file for node_exporter's textfile collector (docs/metrics.md)."""

    textfile_dir: str


class Auth(Record):
    """``[auth]``: IMEX peer authentication and encryption (docs/security.md#imex-peer-authentication).

    Written into each job's config.cfg as ``IMEX_ENABLE_AUTH_ENCRYPTION`` and the keys
    that go with it; the files are taken under ``[paths] root`` and checked before the
    daemon starts (imexctl/imex/peerauth.py).
    """

    enabled: str
    mode: str
    server_key: str
    server_cert: str
    server_cert_auth: str
    client_key: str
    client_cert: str
    client_cert_auth: str
    security_target_override: str


class Containers(Record):
    """``[containers]``: what the enroot hook does when it fails for a job with a channel (docs/containers.md)."""

    on_error: str


SECTIONS: Mapping[str, type] = {
    "paths": PathsSection,
    "commands": Commands,
    "daemon": Daemon,
    "policy": Policy,
    "readiness": Readiness,
    "slurm": Slurm,
    "ports": Ports,
    "resolve": Resolve,
    "topology": Topology,
    "log": Log,
    "metrics": Metrics,
    "auth": Auth,
    "containers": Containers,
}


class Settings(Record):
    """The validated configuration: one typed, frozen object per section."""

    source: Path | None
    paths: Paths
    commands: Commands
    daemon: Daemon
    policy: Policy
    readiness: Readiness
    slurm: Slurm
    ports: Ports
    resolve: Resolve
    topology: Topology
    log: Log
    metrics: Metrics
    auth: Auth
    containers: Containers
    imex: Mapping[str, str]
    #: ``paths`` as plain strings, for the gates (:mod:`imexctl.config.schema`)
    node_paths: NodePaths

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``section__key=value`` overrides (values already parsed)."""
        sections: dict[str, Any] = {}
        for name, value in changes.items():
            section, _, key = name.partition("__")
            if section == "paths" or section not in SECTIONS or key not in schema.SCHEMA[section]:
                raise KeyError(name)
            sections[section] = sections.get(section, getattr(self, section))._replace(**{key: value})
        return self._replace(**sections)


def load(path: str | Path | None, *, node: str, required: bool = True, euid: int | None = None) -> Settings:
    """Read and validate the configuration for this node.

    Args:
        path: the config file (:func:`imexctl.config.schema.find_config` chooses it), or None for built-in defaults.
        node: the Slurm node name, substituted for ``%n`` in ``[paths] root``.
        required: whether a missing file is an error (False for the default path).
        euid: the effective uid (default: this process's); the file must be owned by root or by it.

    Raises:
        ConfigError: naming file, section and key, or file and line (:func:`imexctl.config.schema.parse_ini_subset`);
            its ``where`` is ``<file>:<line>`` (:func:`imexctl.config.schema.where`).
    """
    raw: dict[str, dict[str, str]] = {}
    source: Path | None = None
    text: str | None = None
    try:
        if path is not None:
            text = schema.read_config(str(path), required=required, euid=os.geteuid() if euid is None else euid)
            if text is not None:
                raw, source = schema.parse_ini_subset(text, str(path)), Path(path)
        values, imex = schema.validate(None if path is None else str(path), raw)
    except schema.SchemaError as exc:
        error = ConfigError(str(exc))
        error.where = schema.where(str(path), text, exc) if path is not None else ""
        raise error from exc.__cause__
    return from_values(values, imex, node=node, source=source)


def from_values(
    values: Mapping[str, Mapping[str, Any]], imex: Mapping[str, str], *, node: str, source: Path | None
) -> Settings:
    """The settings from :func:`imexctl.config.schema.validate`'s answer, as :func:`load` builds them.

    The hooks' fast path validates a plain config file before it decides; when
    it leaves the run to the full command, the full command builds its
    settings from that answer instead of reading the file again.
    """
    sections = {name: SECTIONS[name](**keys) for name, keys in values.items() if name != "paths"}
    node_paths = schema.node_paths(values["paths"], node)
    return Settings(source=source, paths=Paths.of_node(node_paths), imex=imex, node_paths=node_paths, **sections)
