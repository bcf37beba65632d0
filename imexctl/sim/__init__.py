"""A simulator of ``nvidia-imex`` and ``nvidia-imex-ctl`` for tests without IMEX hardware.

Console scripts: ``nvidia-imex-sim`` (:mod:`imexctl.sim.daemon`) and
``nvidia-imex-ctl-sim`` (:mod:`imexctl.sim.ctl`).  Nothing here is imported
by imexctl's production code.  Behaviour and choices: ``imexctl/sim/README.md``.
"""

from __future__ import annotations

__all__: list[str] = []
