"""A simulator of ``nvidia-imex`` and ``nvidia-imex-ctl`` for tests without IMEX hardware.

Nothing on the hook path (prolog, epilog, status, cleanup) imports this package.

Console scripts: ``nvidia-imex-sim`` (:mod:`imexctl.sim.daemon`) and
``nvidia-imex-ctl-sim`` (:mod:`imexctl.sim.ctl`).  Behaviour and choices:
``imexctl/sim/README.md``.
"""

from __future__ import annotations

__all__: list[str] = []
