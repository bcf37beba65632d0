"""Render a complete IMEX ``config.cfg`` and ``nodes_config.cfg`` for one job (pure).

We never patch NVIDIA's shipped file: every key we rely on is written, with
comments on lines of their own (design.md source imex-config) and nodes one address
per line with nothing else (design.md source imex-nodes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["DEFAULTS", "job_port", "nodes_hash", "render_config", "render_nodes"]

# Shipped defaults (design.md source imex-config) for keys a site may override through [imex].
DEFAULTS: Mapping[str, str] = {
    "LOG_LEVEL": "4",
    "LOG_APPEND_TO_LOG": "1",
    "LOG_FILE_MAX_SIZE": "1024",
    "LOG_MAX_ROTATE_COUNT": "3",
    "LOG_USE_SYSLOG": "0",
    "NETWORK_INTERFACE": "",
    # A per-job domain has no earlier importers to wait for; RECOVERY would make a
    # rerun on the same trays wait after an unclean stop (design.md source imex-quorum).
    "IMEX_WAIT_FOR_QUORUM": "NONE",
    "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
}


def job_port(job_id: int, port_range: tuple[int, int]) -> int:
    """The job's port in ``port_range`` (SERVER_PORT, IMEX_CMD_PORT).

    A pure function of the job id, so identical on every tray of the job.
    """
    lo, hi = port_range
    return lo + job_id % (hi - lo + 1)


def render_nodes(addresses: Sequence[str]) -> str:
    """One address per line, in node-list order (line index = IMEX node id)."""
    return "".join(f"{a}\n" for a in addresses)


def nodes_hash(addresses: Sequence[str]) -> str:
    """Short hash of the nodes file, logged on every tray so mismatches are easy to spot."""
    import hashlib

    return hashlib.sha256(render_nodes(addresses).encode()).hexdigest()[:16]


def render_config(
    *,
    job_id: int,
    port: int,
    cmd_port: int,
    bind_ip: str,
    nodes_path: Path,
    log_file: Path,
    overrides: Mapping[str, str],
    auth: Mapping[str, str] | None = None,
) -> str:
    """The job's complete config.cfg.

    ``DAEMONIZE=0``: both backends supervise the daemon themselves (systemd
    ``Type=simple`` or our detached spawn), so it must stay in the foreground.
    ``auth``: the authentication lines from ``[auth]`` (:func:`imexctl.imex.peerauth.config_values`);
    None means off.
    """
    values = {**DEFAULTS, **overrides}
    auth_values = {"IMEX_ENABLE_AUTH_ENCRYPTION": "0"} if auth is None else auth
    lines = [
        f"# IMEX config for Slurm job {job_id}, written by imexctl. Do not edit: rewritten per job.",
        f"LOG_FILE_NAME={log_file}",
        *(f"{k}={values[k]}" for k in sorted(values)),
        "# peer authentication and encryption, from imexctl's [auth]",
        *(f"{k}={v}" for k, v in auth_values.items()),
        "# the unit (Type=simple) or imexctl's exec backend supervises the daemon",
        "DAEMONIZE=0",
        "# this tray's own address, so a daemon never binds another tray's address",
        f"BIND_INTERFACE_IP={bind_ip}",
        "# per-job port, identical on every tray of the job",
        f"SERVER_PORT={port}",
        f"IMEX_NODE_CONFIG_FILE={nodes_path}",
        "# command service for nvidia-imex-ctl: -N asks every tray's service over the network,",
        "# so it listens on this tray's own address, same per-job port on every tray; no Unix socket",
        "IMEX_CMD_ENABLED=1",
        f"IMEX_CMD_BIND_INTERFACE_IP={bind_ip}",
        f"IMEX_CMD_PORT={cmd_port}",
        "IMEX_CMD_UNIX_DOMAIN_PATH=",
    ]
    return "\n".join(lines) + "\n"
