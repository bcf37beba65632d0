"""What every step receives (the seams, the settings, the logger), and the one place that builds it.

:func:`build` is the composition root of every command that reads the
settings: this node's name, which config file (the hooks' lookup, or for an
admin's command the file the hooks read under slurmd), the settings, the
logging, the host and the GPU, in that order.  The hooks (``cli``), ``status``,
``cleanup``, ``doctor``, ``netcheck``, ``topology``, ``health`` and ``why``
each say what they need (:class:`Needs`) and build nothing themselves.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

from imexctl.platform import Record
from imexctl.platform.errors import ImexctlError, Terminated

if TYPE_CHECKING:
    from collections.abc import Mapping

    from imexctl.config.settings import Settings
    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["Built", "Needs", "Runtime", "bind", "build", "log_failed", "terminations", "with_gpu"]


def _no_step(_name: str) -> None:
    return None


class Runtime(Record):
    """The seams every step receives.

    ``on_step`` is called with a name at each step boundary: the prolog's
    ``locked``, ``claimed``, ``files_written``, ``daemon_started``, ``ready``,
    ``channel_created``; the epilog's and cleanup's ``locked``; teardown's
    ``daemon_stopped``, ``channel_removed``, ``removed``.  Production passes
    nothing.  Fault-injection tests use it to kill or pause the process
    exactly there (tests/faults/).
    """

    host: Host
    gpu: Gpu
    settings: Settings
    log: Any
    on_step: Callable[[str], None] = _no_step

    def step(self, name: str) -> None:
        """Mark a step boundary."""
        self.on_step(name)


class Needs(Record):
    """What a command needs built (:func:`build`).

    ``logs``: ``hook`` (the log file through ``log.LineLogger``, without
    structlog: the prolog, the epilog, ``health``), ``command`` (the log
    file through structlog: ``status``, ``cleanup``), ``stderr`` (structlog,
    no log file: ``doctor``, ``netcheck``) or ``none`` (``why``, ``topology``).
    ``gpu``: ``nvml`` (NVML, asked only when a step asks), ``policy`` (only
    with ``[policy] fabric = nvml``) or ``none`` (no GPU: the hooks' early
    paths, which never ask NVML).  ``config``: ``strict`` (a file that does not
    load fails the command), ``lenient`` (the defaults, and why:
    ``doctor``, ``health``) or ``none`` (the defaults, no file read:
    ``topology``).  ``hook_lookup``: find the file as the hooks do from their
    own environment; else as under slurmd (``slurm.under_slurmd``).
    ``quiet``: the log's lines reach stderr only with ``-v`` (stdout says it all).
    """

    logs: str = "command"
    gpu: str = "nvml"
    config: str = "strict"
    hook_lookup: bool = False
    quiet: bool = False


class Built(Record):
    """What :func:`build` made: the runtime, this node's name, why the config did not load ('' when it did).

    ``lookup`` is the environment the config was looked up in (``SLURM_CONF``
    added as slurmd would give it, for an admin's command).
    """

    rt: Runtime
    node: str
    problem: str
    lookup: Mapping[str, str]
    #: the config file chosen (``schema.find_config``), read or absent; '' when none was looked for
    path: str = ""


def build(
    command: str,
    env: Mapping[str, str],
    needs: Needs,
    *,
    config: str | None = None,
    verbose: bool = False,
    node: str | None = None,
    host: Host | None = None,
    gpu: Gpu | None = None,
    read: Any = None,
) -> Built:
    """Node name, config lookup, settings, logging, host and GPU, in that order, as ``needs`` says.

    ``read`` is what the hooks' fast path read before it declined
    (``entry.Read``): the settings are built from its validated sections, the
    file is not read again.  ``host`` and ``gpu`` are the tests' fakes.

    Raises:
        ConfigError: with ``config = strict``, the file does not load (stderr has its line).
        EnvironmentError_: the node name is unusable (``[paths] root`` may hold ``%n``).
    """
    from imexctl import slurm
    from imexctl.slurm.job import node_name

    node = node or node_name(env, or_host=True)  # checked before it reaches a path
    lookup = env if needs.hook_lookup else slurm.under_slurmd(env)
    found = "" if read is not None or needs.config == "none" else _find_config(config, lookup)[0]
    cfg, problem = _settings(command, lookup, needs, config, node, read, verbose)
    logger = _logging(command, env, needs, cfg, None if problem else cfg.paths.log_file, verbose)
    if host is None:
        from imexctl.platform.host import RealHost

        host = RealHost()
    if gpu is None and (needs.gpu == "nvml" or (needs.gpu == "policy" and cfg.policy.fabric == "nvml")):
        from imexctl.gpu.fabric import NvmlGpu

        gpu = NvmlGpu()
    return Built(Runtime(host, gpu, cfg, logger), node, problem, lookup, found)  # type: ignore[arg-type]  # gpu: Needs


def _find_config(config: str | None, lookup: Mapping[str, str]) -> tuple[str, bool]:
    """``schema.find_config`` with the ``SLURM_CONF`` of ``lookup`` (slurmd's, or as under slurmd)."""
    from imexctl import slurm
    from imexctl.config import schema

    return schema.find_config(config, lookup, slurm_conf=slurm.value(lookup, slurm.CONF))


def log_context(command: str, env: Mapping[str, str]) -> dict[str, object]:
    """Hook, job id and node for every line of a command's log."""
    from imexctl import slurm

    context: dict[str, object] = {"hook": command}
    if command in ("prolog", "epilog"):
        # raw values, so even a failure before the job is parsed names it; the hooks rebind parsed ones
        context.update(job_id=slurm.value(env, slurm.JOB_ID) or "?", node=slurm.value(env, slurm.NODENAME) or "?")
    return context


def with_gpu(rt: Runtime) -> Runtime:
    """``rt`` with NVML as its GPU when it has none yet (a hook past its early paths, which never ask NVML)."""
    if rt.gpu is not None:
        return rt
    from imexctl.gpu.fabric import NvmlGpu

    return rt._replace(gpu=NvmlGpu())


def _settings(
    command: str, lookup: Mapping[str, str], needs: Needs, config: str | None, node: str, read: Any, verbose: bool
) -> tuple[Settings, str]:
    """The settings and why the file did not load ('' when it did, or with ``config = strict``, which raises)."""
    from pathlib import Path

    from imexctl.config import settings
    from imexctl.platform.errors import ConfigError

    if read is not None:
        source = Path(read.config) if read.found else None
        return settings.from_values(read.values, read.imex, node=node, source=source), ""
    if needs.config == "none":
        return settings.load(None, node=node), ""
    path, required = _find_config(config, lookup)
    try:
        return settings.load(path, node=node, required=required), ""
    except ConfigError as exc:
        if needs.config == "lenient":
            return settings.load(None, node=node), str(exc)
        from imexctl.platform import logsetup

        opened = logsetup.open_command_sink(None, syslog=False, verbose=verbose)  # no log file known: stderr
        logsetup.setup_command_logging("info", log_context(command, lookup), opened)
        raise


def _logging(command: str, env: Mapping[str, str], needs: Needs, cfg: Settings, log_file: Any, verbose: bool) -> Any:
    """The command's logger, its lines where ``needs.logs`` says (a config that did not load names no log file)."""
    from imexctl.platform import logsetup

    if needs.logs == "none":
        return None
    if needs.logs == "stderr":
        import structlog

        logsetup.configure_logging(level=cfg.log.level, stderr_level="info" if verbose else "warning")
        return structlog.get_logger()
    opened = logsetup.open_command_sink(log_file, syslog=cfg.log.syslog == "yes", verbose=verbose)
    if needs.quiet:
        opened[0].quiet = not verbose
    if needs.logs == "hook":
        # structlog's lines without importing structlog: a hook delays every job (docs/performance.md)
        return logsetup.setup_hook_logging(cfg.log.level, log_context(command, env), opened)
    import structlog

    logsetup.setup_command_logging(cfg.log.level, log_context(command, env), opened)
    return structlog.get_logger()


def bind(rt: Runtime, **kw: Any) -> None:
    """Bind fields (job id, node) to every later log line of this run."""
    from imexctl.platform.log import LineLogger

    if isinstance(rt.log, LineLogger):  # the prolog and the epilog: structlog is not imported
        rt.log.bind_context(**kw)
        return
    import structlog

    structlog.contextvars.bind_contextvars(**kw)


def log_failed(event: str, exc: ImexctlError, rt: Runtime, t0: float) -> None:
    """The one summary line of a failed hook run; ``cli.main`` then logs nothing more."""
    rt.log.error(
        event,
        ok=False,
        error_code=exc.code,
        exit_code=int(exc.exit_code),
        reason=str(exc),
        duration_s=round(rt.host.monotonic() - t0, 3),
    )
    exc.logged = True


@contextlib.contextmanager
def terminations(on_signal: Callable[[Terminated], None]) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Terminated`, raised where the hook is.

    slurmd ends a hook that runs past its timeout with SIGTERM and, 10 ms
    later, SIGKILL to the whole process group (design.md source slurm-pgroup):
    ``on_signal`` runs first, so the hook's summary line is written before
    anything else is tried.  The roll-back that follows is best effort; what
    SIGKILL interrupts, the next epilog or ``imexctl cleanup`` finishes.
    """

    def handler(signum: int, _frame: Any) -> None:
        exc = Terminated(f"terminated by {signal.Signals(signum).name}")
        on_signal(exc)
        raise exc

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
