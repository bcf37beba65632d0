"""``imexctl preflight``: would this version's hooks work on this tray as it is? Asked before a switch to it.

The packages run it from the version they are about to switch to, before the
switch (``/opt/imexctl/libexec/imexctl-switch``; docs/operations.md
"Upgrading imexctl while jobs run"), and the Ansible role, with
``--config-only``, as the ``validate`` of the config it writes.  It judges
what would fail every prolog before the prolog starts anything:

- the config file the hooks read under slurmd, read by this version's reader
  (``settings.load``, as the hooks read it; with ``[auth] enabled = yes`` also
  the checks of its files that the prolog makes before each start); a config
  that does not load is the one problem reported (which ``nvidia-imex`` the
  hooks run is the config's to say);
- on the booted system only, ``nvidia-imex --version`` against the loaded
  driver's version (``/proc/driver/nvidia/version``): the daemon refuses to
  start when they differ.  When either is absent, nothing is judged; an image
  being built in a chroot or a container (no systemd running it, or a root
  that is not PID 1's) has no driver of its own to compare with.

Success prints one line on stdout and exits 0; a failure prints one line on
stderr, every problem in it, and exits 78 (the config) or 69 (the daemon's
version).  It writes nothing: no log file, no state.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from imexctl.config.settings import Settings
    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["command", "driver_problem"]

_VERSION_TIMEOUT_S: Final = 10.0


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, _gpu: Gpu | None) -> int:
    """Judge the config and the daemon's version; one line, exit 0, 78 or 69."""
    from imexctl import __version__
    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import ExitCode

    # the file the hooks read under slurmd, read by this version's reader; it writes nothing: no log
    built = build("preflight", env, Needs(logs="none", gpu="none", config="lenient"), config=args.config, host=host)
    if built.problem:
        # which nvidia-imex the hooks would run is the config's to say: nothing more is judged
        return _refused([built.problem], ExitCode.CONFIG)
    cfg, host, path = built.rt.settings, built.rt.host, built.path
    auth = _auth_problems(cfg)
    driver, judged = (
        driver_problem(cfg, host) if not args.config_only else ("", "nvidia-imex not judged (--config-only)")
    )
    if auth or driver:
        return _refused([*auth, *([driver] if driver else [])], ExitCode.CONFIG if auth else ExitCode.UNAVAILABLE)
    read = f"{path} parses" if cfg.source is not None else f"{path} is absent (the defaults hold)"
    sys.stdout.write(f"imexctl {__version__} preflight: {read}; {judged}\n")
    return 0


def _refused(problems: list[str], code: int) -> int:
    from imexctl import __version__

    sys.stderr.write(f"imexctl {__version__} preflight: {'; '.join(problems)}\n")
    return int(code)


def _auth_problems(cfg: Settings) -> list[str]:
    """The prolog's check of ``[auth]``'s files (each start refuses them with exit 78)."""
    if cfg.auth.enabled == "no":
        return []
    from imexctl.imex import peerauth

    return peerauth.problems(cfg)


def driver_problem(cfg: Settings, host: Host) -> tuple[str, str]:
    """(the problem, '' when none; what was judged) of ``nvidia-imex --version`` against the loaded driver."""
    from imexctl.doctor.host import driver_version, imex_version
    from imexctl.platform.errors import CommandError

    why_not = _not_booted(cfg)
    if why_not:
        return "", f"nvidia-imex not judged: {why_not}"
    driver = driver_version(cfg.paths.nvidia_params.parent / "version")
    imex = cfg.commands.nvidia_imex
    if driver is None:
        return "", "nvidia-imex not judged: no NVIDIA driver loaded"
    if not (os.path.isfile(imex) and os.access(imex, os.X_OK)):
        return "", f"nvidia-imex not judged: {imex} is missing"
    try:
        done = host.run((imex, "--version"), timeout_s=_VERSION_TIMEOUT_S)
    except CommandError as exc:
        return f"{imex} --version: {exc}", ""
    found = imex_version(done.stdout + done.stderr)
    if found is None:
        return f"{imex} --version printed no 'IMEX version is:' line", ""
    if found != driver:
        return f"nvidia-imex {found} but the driver is {driver}: every job's daemon would refuse to start", ""
    return "", f"nvidia-imex {found} matches the driver"


def _not_booted(cfg: Settings) -> str:
    """Why this is not the booted tray whose driver /proc shows ('' when it is)."""
    if not (cfg.paths.root / "run/systemd/system").is_dir():
        return "systemd does not run this system (an image being built?)"
    try:
        here, init = os.stat("/"), os.stat("/proc/1/root")
    except OSError:
        return ""
    if (here.st_dev, here.st_ino) != (init.st_dev, init.st_ino):
        return "a chroot (an image being built?)"
    return ""
