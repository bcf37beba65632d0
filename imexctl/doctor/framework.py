"""The doctor's check framework: the :class:`Check` record, its :class:`Context`, and the report forms.

Each check reports ``OK``, ``WARN`` or ``FAIL`` with one line of evidence and,
unless it is OK, one line saying how to fix it.  The check groups
(:mod:`imexctl.doctor.checks`, :mod:`~imexctl.doctor.slurm`,
:mod:`~imexctl.doctor.resolve`, :mod:`~imexctl.doctor.host`,
:mod:`~imexctl.doctor.containers`) import this module; it imports none of
them (:mod:`imexctl.doctor.run` runs them all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Final

if TYPE_CHECKING:
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.output import Json, JsonObject

__all__ = ["FAIL", "OK", "WARN", "Check", "CheckFn", "Context", "Report", "exit_code", "render_text", "under_root"]

OK: Final = "OK"
WARN: Final = "WARN"
FAIL: Final = "FAIL"


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding: a stable dotted ``name``, its status, the evidence and the fix."""

    name: str
    status: str
    message: str
    fix: str = ""

    def data(self) -> JsonObject:
        """The ``--json`` form: name, status, message, fix."""
        return {"name": self.name, "status": self.status, "message": self.message, "fix": self.fix}


@dataclasses.dataclass(frozen=True)
class Context:
    """What every check may read: the runtime (settings, host, GPU), the environment, the node."""

    rt: Runtime
    env: Mapping[str, str]
    node: str
    #: ``--slurm-conf``: the slurm.conf to read instead of the lookup
    slurm_conf: Path | None = None
    #: why the config file did not load ('' when it did; the checks then run with the defaults)
    config_problem: str = ""
    #: ``--nodes``: a host list whose names are resolved as the prolog would ('' for none)
    nodes: str = ""
    #: ``--config``: the config file named on the command line ('' for the hooks' lookup)
    config: str = ""


CheckFn = Callable[[Context], list[Check]]


def under_root(ctx: Context, path: str) -> Path:
    """An absolute system path (``/proc/...``) taken under ``[paths] root``."""
    return ctx.rt.settings.paths.root / path.lstrip("/")


def exit_code(checks: list[Check]) -> int:
    """0 when no check failed, else 1."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def render_text(checks: list[Check]) -> str:
    """One line per check, the fix indented below it, and a closing count."""
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name}: {c.message}")
        if c.fix and c.status != OK:
            lines.append(f"      fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    lines.append(f"{counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Report:
    """What ``imexctl doctor`` found: every check, in report order (``--json``'s ``data`` is their list)."""

    checks: tuple[Check, ...]

    @property
    def failed(self) -> list[str]:
        """The names of the checks that FAILed."""
        return [c.name for c in self.checks if c.status == FAIL]

    def data(self) -> Json:
        """The ``data`` list of ``imexctl doctor --json``."""
        return [c.data() for c in self.checks]
