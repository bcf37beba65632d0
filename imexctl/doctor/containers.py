"""Container checks for ``imexctl doctor``: the routes by which a container could get a channel that is not its job's.

Pure functions over a root directory (``/`` on a tray, a sample tree in the
tests) that return plain :class:`Check` records; the facts behind each rule
and their sources are in docs/containers.md.  Statuses:

- ``FAIL``: broken, or a hole another user can use now: an invalid toolkit
  setting (the toolkit refuses its config), an imexctl enroot hook that
  others may write (it runs in every user's container start);
- ``WARN``: a route across jobs left open, or imexctl's container route
  missing: requests for channels honoured, host nodes re-moded, static CDI
  specs listing channels, no imexctl enroot hook, ``channel0``;
- ``OK``: set as recommended, or the component is not installed.

Nothing here runs a program: the toolkit's version comes from the caller,
who runs :data:`TOOLKIT_VERSION_ARGV` and passes its output.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # EL9's Python 3.9: the same parser, as a package (setup.cfg, pkg/requirements.in)
    import tomli as tomllib

from imexctl.doctor.framework import FAIL, OK, WARN, Check

__all__ = [
    "TOOLKIT_VERSION_ARGV",
    "cdi_checks",
    "channel_checks",
    "enroot_checks",
    "parse_version",
    "run_all",
    "toolkit_checks",
]

TOOLKIT_VERSION_ARGV = ("/usr/bin/nvidia-ctk", "--version")
TOOLKIT_CONFIG = "etc/nvidia-container-runtime/config.toml"
TOOLKIT_PROGRAMS = (
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-container-toolkit",
    "nvidia-ctk",
)
#: first toolkit that honours ignore-imex-channel-requests (v1.17.5, PR #952), first with IMEX requests (v1.14.6)
TOOLKIT_FLAG_VERSION, TOOLKIT_IMEX_VERSION = (1, 17, 5), (1, 14, 6)
ENROOT_CHANNEL_DIR_VERSION = (4, 0, 0)
HOOK_MODULE = "imexctl.channels.enroot"
#: enroot's stock hooks that set up /dev: imexctl's hook must run after them (names sort first)
DEV_HOOKS = ("10-devices.sh", "98-nvidia.sh")
CHANNEL_DIR_NAME = "nvidia-caps-imex-channels"
_MAX_READ = 4 << 20


def run_all(
    root: Path = Path("/"), *, channel_dir: Path | None = None, toolkit_version: str | None = None
) -> list[Check]:
    """Every container check, for the tray whose file system is under ``root``."""
    channels = channel_dir if channel_dir is not None else root / "dev" / CHANNEL_DIR_NAME
    return [
        *toolkit_checks(root, version_output=toolkit_version),
        *cdi_checks(root),
        *enroot_checks(root),
        *channel_checks(channels),
    ]


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first ``X.Y.Z`` in ``text``.

    ``nvidia-ctk --version`` prints ``NVIDIA Container Toolkit CLI version 1.17.5``
    and a ``commit:`` line (nvidia-container-toolkit ``cmd/nvidia-ctk/main.go``,
    ``internal/info/version.go``).
    """
    m = re.search(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _show(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


# ---------------------------------------------------------------- NVIDIA Container Toolkit


def toolkit_checks(root: Path, *, version_output: str | None = None) -> list[Check]:
    """The toolkit's IMEX request path (docs/containers.md, "NVIDIA Container Toolkit").

    Args:
        root: the tray's file system.
        version_output: what :data:`TOOLKIT_VERSION_ARGV` printed, if the caller ran it.
    """
    found = [p for p in TOOLKIT_PROGRAMS if any(_is_file(root / d / p) for d in ("usr/bin", "usr/local/bin"))]
    if not found:
        return [Check("containers.toolkit", OK, "the NVIDIA Container Toolkit is not installed")]
    out = [Check("containers.toolkit", OK, f"the NVIDIA Container Toolkit is installed ({', '.join(found)})")]
    if version_output is not None:
        out.append(_toolkit_version(version_output))
    path = root / TOOLKIT_CONFIG
    try:
        text = _read(path)
    except FileNotFoundError:
        return [*out, _no_toolkit_config(path)]
    except OSError as exc:
        return [*out, Check("containers.toolkit.config", FAIL, f"{path}: {exc.strerror}", f"make {path} readable")]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = f"{path} is not valid TOML ({exc}): the toolkit cannot load it"
        return [*out, Check("containers.toolkit.config", FAIL, msg, f"fix {path} (nvidia-ctk config default)")]
    return [*out, *_toolkit_settings(doc, path)]


def _toolkit_version(output: str) -> Check:
    version = parse_version(output)
    if version is None:
        return Check("containers.toolkit.version", WARN, f"cannot read a version in {output.strip()[:80]!r}")
    if version >= TOOLKIT_FLAG_VERSION:
        return Check("containers.toolkit.version", OK, f"toolkit {_show(version)} knows ignore-imex-channel-requests")
    if version < TOOLKIT_IMEX_VERSION:
        return Check("containers.toolkit.version", OK, f"toolkit {_show(version)} predates IMEX channel requests")
    return Check(
        "containers.toolkit.version",
        WARN,
        f"toolkit {_show(version)} honours NVIDIA_IMEX_CHANNELS and cannot be told to ignore it",
        f"upgrade the NVIDIA Container Toolkit to {_show(TOOLKIT_FLAG_VERSION)} or later",
    )


def _no_toolkit_config(path: Path) -> Check:
    return Check(
        "containers.toolkit.config",
        WARN,
        f"{path} is missing: the defaults honour NVIDIA_IMEX_CHANNELS requests for any channel",
        f"nvidia-ctk config --in-place --set features.ignore-imex-channel-requests "
        f"--set features.disable-imex-channel-creation (writes {path})",
    )


def _toolkit_settings(doc: Mapping[str, Any], path: Path) -> list[Check]:
    ignore = _toml_value(doc, "features", "ignore-imex-channel-requests")
    creation = _toml_value(doc, "features", "disable-imex-channel-creation")
    kmods = _toml_value(doc, "nvidia-container-cli", "load-kmods", True)
    no_creation = "disable-imex-channel-creation = true" if creation is True else "load-kmods = false"
    env = _toml_value(doc, "", "accept-nvidia-visible-devices-envvar-when-unprivileged", True)
    who = "every container" if env is not False else "privileged containers only"
    return [
        Check("containers.toolkit.config", OK, f"{path} parses"),
        _flag(
            "containers.toolkit.imex_requests",
            ("ignore-imex-channel-requests", ignore),
            ok="[features] ignore-imex-channel-requests = true" if ignore is True else "",
            risk="containers get any channel they ask for with NVIDIA_IMEX_CHANNELS",
            path=path,
        ),
        _flag(
            "containers.toolkit.imex_creation",
            ("disable-imex-channel-creation", creation),
            ok=f"no host channel node is created or re-moded ({no_creation})" if creation or kmods is False else "",
            risk="a request for channel N makes the host node 0666 root:root (legacy mode with load-kmods)",
            path=path,
        ),
        Check("containers.toolkit.unprivileged_env", OK, f"environment requests are read from {who}"),
    ]


def _toml_value(doc: Mapping[str, Any], table: str, key: str, default: Any = None) -> Any:
    """``key`` in ``table`` ('' for the top level) of a parsed TOML document, or ``default``."""
    found = doc.get(table, {}) if table else doc
    return found.get(key, default) if isinstance(found, dict) else default


def _flag(name: str, setting: tuple[str, object], *, ok: str, risk: str, path: Path) -> Check:
    """One ``[features]`` flag: FAIL if not a boolean, OK when ``ok`` says why, else WARN."""
    key, value = setting
    fix = f"set [features] {key} = true in {path} (a TOML boolean, no quotes)"
    if value is not None and not isinstance(value, bool):
        return Check(name, FAIL, f"[features] {key} = {value!r} is not a boolean: the toolkit refuses its config", fix)
    if ok:
        return Check(name, OK, ok)
    return Check(name, WARN, f"{risk} ([features] {key} is not true)", fix)


# ---------------------------------------------------------------- CDI specs


def cdi_checks(root: Path) -> list[Check]:
    """Static CDI specs that list channel nodes: any container may ask for them by name, whatever the flags."""
    found = []
    for rel in ("etc/cdi", "var/run/cdi", "run/cdi"):
        directory = _real_dir(root, rel)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name) if directory else ():
            if entry.name.endswith((".json", ".yaml", ".yml")) and entry.is_file(follow_symlinks=False):
                try:
                    if CHANNEL_DIR_NAME in _read(Path(entry.path)):
                        found.append(entry.path)
                except OSError:
                    continue
    if not found:
        return [Check("containers.cdi", OK, "no CDI spec lists IMEX channels")]
    return [
        Check(
            "containers.cdi",
            WARN,
            f"CDI specs list IMEX channel nodes, which containers can request by name: {', '.join(found)}",
            "remove them; generate specs without --mode=imex or management (nvidia-ctk cdi generate)",
        )
    ]


# ---------------------------------------------------------------- enroot


def enroot_checks(root: Path) -> list[Check]:
    """The configuration and hooks of enroot (docs/containers.md, "enroot")."""
    script = root / "usr/bin/enroot"
    try:
        text = _read(script)
    except OSError:
        return [Check("containers.enroot", OK, "enroot is not installed")]
    m = re.search(r'ENROOT_VERSION="([0-9.]+)"', text)
    version = parse_version(m[1]) if m else None
    conf_path = re.search(r'config::init "(/[^"]+)"', text)
    conf = _enroot_conf(root, conf_path[1] if conf_path else "/etc/enroot/enroot.conf")
    sysconf = conf.get("ENROOT_SYSCONF_PATH", "/etc/enroot")
    if not sysconf.startswith("/") or "$" in sysconf:
        sysconf = "/etc/enroot"
    hooks = root / sysconf.lstrip("/") / "hooks.d"
    restrict = _enroot_flag(conf.get("ENROOT_RESTRICT_DEV", ""))
    name = f"enroot {_show(version)}" if version else "enroot (version unknown)"
    dev = "a fresh /dev (ENROOT_RESTRICT_DEV)" if restrict else "the host's /dev"
    out = [Check("containers.enroot", OK, f"{name}; containers get {dev} unless the user's environment says otherwise")]
    old = version is not None and version < ENROOT_CHANNEL_DIR_VERSION
    out.append(_enroot_hook(root, hooks, old=old, restrict=restrict))
    out.extend(_enroot_other_hooks(root, hooks))
    out.append(_enroot_environment(root / sysconf.lstrip("/") / "environ.d", conf))
    return out


def _enroot_conf(root: Path, conf: str) -> dict[str, str]:
    """``KEY value`` / ``KEY=value`` lines of enroot.conf and enroot.conf.d/*.conf (enroot.in ``config::load``)."""
    path = root / conf.lstrip("/")
    files = [path]
    try:
        files += sorted(p for p in Path(f"{path}.d").iterdir() if p.name.endswith(".conf"))
    except OSError:
        pass
    values: dict[str, str] = {}
    for file in files:
        try:
            lines = _read(file).splitlines()
        except OSError:
            continue
        for line in lines:
            m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:=|[ \t])[ \t]*(.*?)\s*$", line)
            if m and re.match(r"ENROOT_|NVIDIA_|MELLANOX_", m[1]):
                values.setdefault(m[1], m[2].strip("\"'"))  # the first wins: enroot exports without overwriting
    return values


def _enroot_flag(value: str) -> bool:
    """Set and not one of the values enroot treats as unset (enroot.in ``config::fini``)."""
    return bool(value) and not re.fullmatch(r"no?|N[oO]?|[fF](alse)?|FALSE", value)


def _enroot_hook(root: Path, hooks: Path, *, old: bool, restrict: bool) -> Check:
    ours = [(p, real) for p, real in _hook_files(root, hooks) if HOOK_MODULE in _text(real)]
    install = f"install -o root -g root -m 0755 hooks/enroot/99-imexctl.sh {hooks}/99-imexctl.sh"
    if not ours:
        if old and restrict:
            seen = "enroot < 4.0 with ENROOT_RESTRICT_DEV gives containers no channel at all"
        else:
            seen = "enroot containers see every channel node of the tray (stale ones, channel0), not only their job's"
        msg = f"imexctl's enroot hook is not in {hooks}: {seen}"
        return Check("containers.enroot.hook", WARN, msg, install)
    path, real = ours[0]
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        return Check("containers.enroot.hook", WARN, f"{path} is not a regular file", install)
    suspects = [real] if real == path else [real, real.parent]  # a link: also who may replace its target
    writable = [x for x in suspects if _others_may_write(x)]
    if writable:
        mode = f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
        msg = f"{writable[0]} may be written by others than root ({mode}): it runs in every user's container start"
        return Check("containers.enroot.hook", FAIL, msg, f"chown root:root {real} && chmod 0755 {real}")
    if st.st_mode & 0o005 != 0o005:
        msg = f"{path} is not readable and executable by users: enroot skips it"
        return Check("containers.enroot.hook", WARN, msg, f"chmod 0755 {real}")
    late = [n for n in DEV_HOOKS if (hooks / n).exists() and n > path.name]
    if late:
        return Check("containers.enroot.hook", WARN, f"{', '.join(late)} run after {path.name} and undo it", install)
    if re.search(rf"^\s*exec\s+\S*python\S*\s.*{re.escape(HOOK_MODULE)}", _text(real), re.MULTILINE):
        # imexctl < issue 25's hook: an interpreter or install that cannot run stopped every container
        msg = f"{path} is an older copy that stops every container start on the tray when imexctl cannot run"
        return Check("containers.enroot.hook", WARN, msg, install)
    return Check("containers.enroot.hook", OK, f"{path} shows each container exactly its job's channel")


def _others_may_write(path: Path) -> bool:
    st = os.stat(path)
    return st.st_uid != 0 or bool(st.st_mode & 0o022)


def _enroot_other_hooks(root: Path, hooks: Path) -> list[Check]:
    risky = [
        p.name
        for p, real in _hook_files(root, hooks)
        if HOOK_MODULE not in _text(real) and re.search(r"--imex-channel|NVIDIA_IMEX_CHANNELS", _text(real))
    ]
    if not risky:
        return [Check("containers.enroot.other_hooks", OK, "no other enroot hook handles IMEX channels")]
    msg = f"enroot hooks in {hooks} handle IMEX channels from user input: {', '.join(risky)}"
    return [
        Check("containers.enroot.other_hooks", WARN, msg, "review them: a channel must come from the job, not the user")
    ]


def _enroot_environment(environ_d: Path, conf: dict[str, str]) -> Check:
    fixed = [p.name for p in _files(environ_d, ".env") if re.search(r"(?m)^\s*NVIDIA_IMEX_CHANNELS=", _text(p))]
    if "NVIDIA_IMEX_CHANNELS" in conf:
        fixed.append("enroot.conf")
    if not fixed:
        return Check("containers.enroot.environment", OK, "no fixed NVIDIA_IMEX_CHANNELS in enroot's configuration")
    msg = f"a fixed NVIDIA_IMEX_CHANNELS in {', '.join(fixed)} is wrong for every job but one"
    return Check("containers.enroot.environment", WARN, msg, "remove it; imexctl's hook sets the job's value")


def _hook_files(root: Path, hooks: Path) -> list[tuple[Path, Path]]:
    """``(entry, file it names)`` for each ``*.sh`` in ``hooks``; a symlink's target is taken under ``root``.

    The packages install the hook in /usr/share/imexctl/hooks/enroot and a site
    may link it, as it links the Slurm hooks (docs/install.md).
    """
    out = []
    for path in _files(hooks, ".sh"):
        real = path
        for _ in range(8):
            if not real.is_symlink():
                break
            target = os.readlink(real)
            real = root / target.lstrip("/") if target.startswith("/") else real.parent / target
        out.append((path, real))
    return out


# ---------------------------------------------------------------- channel0


def channel_checks(channel_dir: Path) -> list[Check]:
    """``channel0`` (``NVreg_CreateImexChannel0=1``): a channel every container that sees the directory gets."""
    if not os.path.lexists(channel_dir / "channel0"):
        return [Check("containers.channel0", OK, f"no {channel_dir}/channel0")]
    return [
        Check(
            "containers.channel0",
            WARN,
            f"{channel_dir}/channel0 exists (NVreg_CreateImexChannel0=1?): containers that see the directory get it",
            "remove NVreg_CreateImexChannel0=1 from the nvidia module options",
        )
    ]


# ---------------------------------------------------------------- files


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(22, "not a regular file", str(path))
        return f.read(_MAX_READ).decode(errors="replace")


def _text(path: Path) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def _is_file(path: Path) -> bool:
    return os.path.isfile(path)


def _files(directory: Path, suffix: str) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))
    except OSError:
        return []


def _real_dir(root: Path, rel: str) -> Path | None:
    """``root/rel`` if every component below ``root`` is a real directory (no symlink out of a sample tree)."""
    path = root
    for part in rel.split("/"):
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path
