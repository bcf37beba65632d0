"""Where imexctl keeps things on a node: the ``[paths]`` of the config, under ``root``, and each job's files.

:func:`imexctl.config.schema.node_paths` decides where each path lies for a
node (light, for the hooks' fast tier, the gates and the job's own user:
:class:`imexctl.config.schema.NodePaths`); :meth:`Paths.of_node` makes
paths of its answer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from imexctl.config import schema
from imexctl.platform import Record

if TYPE_CHECKING:
    from imexctl.config.schema import NodePaths

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
    def of_node(cls, found: NodePaths) -> Paths:
        """This node's ``[paths]`` (:func:`imexctl.config.schema.node_paths`) as paths; None for one not set."""
        return cls(*(Path(p) if p else None for p in found))  # type: ignore[arg-type]  # NodePaths' order

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
