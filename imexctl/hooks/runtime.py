"""What every hook step receives: the seams (host, GPU), the settings and the logger."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

from imexctl.platform.errors import ImexctlError, Terminated
from imexctl.platform.record import Record

if TYPE_CHECKING:
    from imexctl.config.settings import Settings
    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["Runtime", "bind", "log_failed", "terminations"]


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
