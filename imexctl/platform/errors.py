"""Exit codes and the one error tree imexctl raises.

Inner layers raise an :class:`ImexctlError` subclass that carries data; only
``cli.main()`` logs it and maps it to an exit code.  Exit codes follow BSD
``sysexits`` so that they mean something to operators reading slurmd's log.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar

__all__ = [
    "CommandError",
    "ConfigError",
    "DaemonError",
    "DaemonLostError",
    "DeviceError",
    "DoctorFailed",
    "DomainBusyError",
    "EnvironmentError_",
    "ExitCode",
    "FileError",
    "GpuError",
    "HealthTimeout",
    "ImexctlError",
    "JobNotInLog",
    "LockTimeout",
    "NetcheckBlocked",
    "NodeListError",
    "NotPrivilegedError",
    "OutputError",
    "PortHeldError",
    "ReportError",
    "ResolveError",
    "SlurmQueryError",
    "Terminated",
    "TopologyMismatch",
    "TrayUnhealthy",
    "UnsafeNodeError",
    "shorten",
]


def shorten(text: str, limit: int = 200) -> str:
    """``repr(text)`` cut after ``limit`` characters, so a message quotes bad input without flooding the log."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


class ExitCode(enum.IntEnum):
    """Process exit codes (``sysexits.h``); documented in docs/exit-codes.md."""

    OK = 0
    FAILURE = 1
    USAGE = 64
    DATAERR = 65
    UNAVAILABLE = 69
    SOFTWARE = 70
    OSERR = 71
    TEMPFAIL = 75
    NOPERM = 77
    CONFIG = 78

    @property
    def meaning(self) -> str:
        """A few words for ``imexctl --help``; docs/exit-codes.md has the whole story."""
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.FAILURE: "the demo's job failed, doctor found a FAIL, health a fault of the tray, or why no line",
    ExitCode.USAGE: "usage",
    ExitCode.DATAERR: "bad node list, job environment or topology report",
    ExitCode.UNAVAILABLE: "IMEX, NVML, systemd or name resolution unavailable, or the node is busy",
    ExitCode.SOFTWARE: "node left unsafe, or an internal error",
    ExitCode.OSERR: "device node or file error",
    ExitCode.TEMPFAIL: "not ready in time, or the node lock was busy",
    ExitCode.NOPERM: "not root",
    ExitCode.CONFIG: "invalid configuration, or a topology source that disagrees with NVML",
}


class ImexctlError(Exception):
    """Base for every failure imexctl expects and reports."""

    code: ClassVar[str] = "error"
    exit_code: ClassVar[ExitCode] = ExitCode.FAILURE
    #: set once a summary line (``prolog.done``, ``epilog.done``) reported this error,
    #: so ``cli.main`` does not log it a second time
    logged: bool = False


class ConfigError(ImexctlError):
    """The imexctl configuration file is invalid."""

    code = "config_invalid"
    exit_code = ExitCode.CONFIG
    #: ``<file>:<line>`` of what is wrong, ``<file>`` where no line is ('' when no file is to blame)
    where: str = ""


class TopologyMismatch(ImexctlError):
    """This tray's NVLink domain (NVML) is not the one the configured topology source gives it."""

    code = "topology_mismatch"
    exit_code = ExitCode.CONFIG


class ReportError(ImexctlError):
    """``imexctl topology blocks``: a malformed report line, or one node reported with two keys."""

    code = "report_invalid"
    exit_code = ExitCode.DATAERR


class NodeListError(ImexctlError):
    """A Slurm node list could not be parsed; keeps the faulty part."""

    code = "nodelist_invalid"
    exit_code = ExitCode.DATAERR

    def __init__(self, nodelist: str, part: str, reason: str) -> None:
        super().__init__(f"invalid node list: {reason}: {shorten(part)} in {shorten(nodelist)}")
        self.nodelist = nodelist
        self.part = part
        self.reason = reason


# the trailing underscore: the builtin name EnvironmentError is taken
class EnvironmentError_(ImexctlError):  # noqa: N801
    """The job environment given by slurmd is missing or malformed."""

    code = "job_env_invalid"
    exit_code = ExitCode.DATAERR


class ResolveError(ImexctlError):
    """A tray name could not be turned into exactly one address."""

    code = "resolve_failed"
    exit_code = ExitCode.UNAVAILABLE


class NotPrivilegedError(ImexctlError):
    """The command needs root."""

    code = "not_root"
    exit_code = ExitCode.NOPERM


class LockTimeout(ImexctlError):
    """The per-node lock was not acquired in time."""

    code = "lock_timeout"
    exit_code = ExitCode.TEMPFAIL


class DomainBusyError(ImexctlError):
    """Another job (or a stray daemon) holds this node's IMEX domain."""

    code = "domain_busy"
    exit_code = ExitCode.UNAVAILABLE


class PortHeldError(ImexctlError):
    """A job's port on this tray is held by a process that is no IMEX daemon: a local user's, or a service's.

    Not ``domain_busy``: no job's domain and no stale daemon is in the way,
    and ``imexctl cleanup`` frees nothing.  The prolog fails all the same (the
    job cannot get its domain here) and names the holder; what keeps users off
    the ports for good is the port guard (docs/security.md).
    """

    code = "port_held"
    exit_code = ExitCode.UNAVAILABLE


class CommandError(ImexctlError):
    """An external command could not be run, timed out, or failed."""

    code = "command_failed"
    exit_code = ExitCode.UNAVAILABLE

    def __init__(
        self,
        argv: Sequence[str],
        reason: str,
        *,
        returncode: int | None = None,
        output: str = "",
    ) -> None:
        tail = output.strip()[-400:]
        msg = f"{argv[0] if argv else '?'}: {reason}"
        if tail:
            msg += f": {tail}"
        super().__init__(msg)
        self.argv = tuple(argv)
        self.reason = reason
        self.returncode = returncode
        self.output = output


class OutputError(ImexctlError):
    """An external command printed something imexctl cannot parse."""

    code = "output_invalid"
    exit_code = ExitCode.UNAVAILABLE


class DaemonError(ImexctlError):
    """The IMEX daemon could not be started or stopped."""

    code = "daemon_failed"
    exit_code = ExitCode.UNAVAILABLE


class DaemonLostError(ImexctlError):
    """The job's daemon ended before the job, and ``[policy] lost_daemon = drain``: the epilog drains the tray."""

    code = "daemon_lost"
    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, message: str, lost: int = 1) -> None:
        super().__init__(message)
        #: how many of the epilog's domains lost their daemon (counted in the metrics)
        self.lost = lost


class HealthTimeout(ImexctlError):
    """The IMEX domain did not become ready before the deadline."""

    code = "not_ready"
    exit_code = ExitCode.TEMPFAIL

    def __init__(
        self,
        message: str,
        *,
        last_status: str,
        attempts: int,
        waited_s: float,
        local_ready: bool = False,
        isolated: bool = False,
        summary: str = "",
        unsure: bool = False,
    ) -> None:
        super().__init__(message)
        self.last_status = last_status
        self.attempts = attempts
        self.waited_s = waited_s
        #: this tray's own daemon reported READY at some point: what was missing were its peers
        self.local_ready = local_ready
        #: this tray reached the command service of none of its peers: most likely its own fault
        self.isolated = isolated
        #: the failure in a few words, naming trays by address (the node's drain reason maps them to names)
        self.summary = summary
        #: what this tray saw could also mean its own fault (it reached none of its peers, which reach it)
        self.unsure = unsure


class SlurmQueryError(ImexctlError):
    """slurmctld could not be asked what a het job's prolog needs to know, or ``imexctl drains`` what sinfo says."""

    code = "slurm_query_failed"
    exit_code = ExitCode.UNAVAILABLE


class Terminated(ImexctlError):
    """A hook was stopped by SIGTERM or SIGINT (slurmd's timeout, or an operator)."""

    code = "terminated"
    exit_code = ExitCode.TEMPFAIL


class DeviceError(ImexctlError):
    """An IMEX channel device node could not be found, created or removed."""

    code = "device_failed"
    exit_code = ExitCode.OSERR


class FileError(ImexctlError):
    """A node-local file or directory imexctl owns could not be written or removed."""

    code = "file_failed"
    exit_code = ExitCode.OSERR


class GpuError(ImexctlError):
    """NVML is missing or reports that the NVLink fabric is not usable."""

    code = "gpu_failed"
    exit_code = ExitCode.UNAVAILABLE


class UnsafeNodeError(ImexctlError):
    """Teardown could not leave the node safe for the next job."""

    code = "node_unsafe"
    exit_code = ExitCode.SOFTWARE


class DoctorFailed(ImexctlError):
    """``imexctl doctor`` found at least one check that FAILs (the checks say which and why)."""

    code = "doctor_failed"
    exit_code = ExitCode.FAILURE


class TrayUnhealthy(ImexctlError):
    """``imexctl health`` found a fault of the tray (its findings say which and why)."""

    code = "tray_unhealthy"
    exit_code = ExitCode.FAILURE


class NetcheckBlocked(ImexctlError):
    """``imexctl netcheck``: a pair of trays was blocked on a port range, or (first tray) a tray's row is missing."""

    code = "netcheck_blocked"
    exit_code = ExitCode.FAILURE


class JobNotInLog(ImexctlError):
    """``imexctl why``: the log of this tray (and its rotated copies) holds no line about the job."""

    code = "job_not_in_log"
    exit_code = ExitCode.FAILURE
