"""Where imexctl keeps things on a node: the ``[paths]`` of the config, under ``root``, and each job's files.

:func:`imexctl.config.schema.node_paths` decides where each path lies for a
node (light, for the hooks' fast path and the job's own user);
:meth:`Paths.of_node` wraps its answer in :class:`Paths`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imexctl.config import schema
from imexctl.platform.record import Record

__all__ = ["JobDir", "Paths"]


class JobDir(Record):
    """One job's directory on a node, ``<run_dir>/jobs/<job id>/``, and every file in it."""

    job_id: int
    path: Path

    @property
    def config(self) -> Path:
        """The daemon's complete ``config.cfg``."""
        return self.path / schema.JOB_CONFIG

    @property
    def nodes(self) -> Path:
        """The nodes file, one address per line."""
        return self.path / schema.JOB_NODES

    @property
    def state(self) -> Path:
        """What the prolog set up (``state.json``)."""
        return self.path / schema.JOB_STATE

    @property
    def pid_file(self) -> Path:
        """The exec backend's record of the daemon (``daemon.pid``)."""
        return self.path / schema.JOB_PID_FILE

    def exists(self) -> bool:
        """Whether the directory (or anything at its path) exists."""
        return os.path.lexists(self.path)


class Paths(Record):
    """Every path imexctl reads or writes on a node, already under ``root``."""

    root: Path
    run_dir: Path
    channel_dir: Path
    proc_devices: Path
    log_file: Path | None
    imex_log_file: Path
    hosts_file: Path
    topology_file: Path | None
    topology_map: Path | None
    nvidia_params: Path

    @classmethod
    def of_node(cls, section: Mapping[str, str], node: str) -> Paths:
        """``[paths]`` as validated, for ``node`` (:func:`imexctl.config.schema.node_paths`)."""
        p = schema.node_paths(section, node)
        found: dict[str, Any] = {f: Path(p[f]) if p[f] else None for f in cls._fields}
        return cls(**found)

    @property
    def jobs_dir(self) -> Path:
        """Directory holding one subdirectory per job that owns (or owned) the domain."""
        return self.run_dir / schema.JOBS_DIR

    @property
    def lock_file(self) -> Path:
        """The per-node lock serialising prologs, epilogs and cleanup."""
        return self.run_dir / "lock"

    def job(self, job_id: int) -> JobDir:
        """The job's directory and files."""
        return JobDir(job_id, Path(schema.job_dir(str(self.run_dir), job_id)))
