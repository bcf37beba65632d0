"""IMEX peer authentication: the ``config.cfg`` keys ``[auth]`` turns into, and the checks of their files.

Key names and values are those of NVIDIA's shipped ``config.cfg`` (design.md
source imex-auth).  imexctl writes ``IMEX_AUTH_SOURCE=FILE`` and nothing else:
with ``ENV_PATH`` or ``ENV_VAL`` the values would have to travel through the
daemon's environment (a static unit file; for ``ENV_VAL`` the key itself), and
imexctl could not check them before the daemon starts.

The GSSAPI modes read the host's Kerberos keytab through ``KRB5_CLIENT_KTNAME``,
which the unit we ship sets like the unit NVIDIA's package installs, and which
the exec backend passes the same way (:data:`DAEMON_ENV`, design.md source
imex-unit-krb5).

Every file is taken under ``[paths] root`` and must be a regular file reached
without following a symlink, owned by root, not writable by group or others,
in a directory that only root may write; private keys and the keytab must not
be readable by group or others either.  Pure apart from ``lstat``/``stat``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from imexctl.config.schema import AUTH_FILE_KEYS
from imexctl.config.settings import Auth, Settings
from imexctl.platform import Record
from imexctl.platform.errors import ConfigError
from imexctl.platform.fsutil import check_private_dir

__all__ = ["DAEMON_ENV", "KEYTAB", "AuthFile", "check", "config_values", "files", "problems"]

#: the host keytab the GSSAPI modes use, as NVIDIA's unit names it (design.md source imex-unit-krb5)
KEYTAB: Final = "/etc/krb5.keytab"
#: what the daemon gets in its environment from either backend, beyond PATH and LANG
DAEMON_ENV: Final[Mapping[str, str]] = {"KRB5_CLIENT_KTNAME": KEYTAB}


class AuthFile(Record):
    """One file the daemon will read: the ``[auth]`` key naming it, its path under root, whether it is secret."""

    key: str
    path: Path
    secret: bool


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def config_values(auth: Auth, root: Path) -> dict[str, str]:
    """The authentication lines of a job's ``config.cfg``, in file order.

    Off: only ``IMEX_ENABLE_AUTH_ENCRYPTION=0``.  ``SSL_TLS``: the source and the six files
    (paths under ``root``, as the daemon must open them).  GSSAPI: the mode only; the
    ``IMEX_GSS_*`` tuning keys come from ``[imex]``.
    """
    if auth.enabled == "no":
        return {"IMEX_ENABLE_AUTH_ENCRYPTION": "0"}
    values = {"IMEX_ENABLE_AUTH_ENCRYPTION": "1", "IMEX_AUTH_ENCRYPTION_MODE": auth.mode}
    if auth.mode == "SSL_TLS":
        values["IMEX_AUTH_SOURCE"] = "FILE"
        values.update({f"IMEX_{key.upper()}": str(_under(root, getattr(auth, key))) for key in AUTH_FILE_KEYS})
        if auth.security_target_override:
            values["IMEX_SECURITY_TARGET_OVERRIDE"] = auth.security_target_override
    return values


def files(settings: Settings) -> list[AuthFile]:
    """The files the job's daemon will read for authentication (none when it is off)."""
    auth, root = settings.auth, settings.paths.root
    if auth.enabled == "no":
        return []
    if auth.mode == "SSL_TLS":
        return [AuthFile(k, _under(root, getattr(auth, k)), k.endswith("_key")) for k in AUTH_FILE_KEYS]
    return [AuthFile("keytab", _under(root, KEYTAB), True)]


def problems(settings: Settings) -> list[str]:
    """What is wrong: one ``[auth] <key>: <path>: <reason>`` per bad file, then one line per bad directory."""
    out: list[str] = []
    dirs: dict[Path, list[str]] = {}
    for f in files(settings):
        where = f"[auth] {f.key}" if f.key != "keytab" else f"[auth] mode = {settings.auth.mode}: keytab"
        why = _file_problem(f)
        if why:
            out.append(f"{where}: {f.path}: {why}")
        else:
            dirs.setdefault(f.path.parent, []).append(f.key)
    for directory, keys in dirs.items():
        why = _dir_problem(directory)
        if why:
            out.append(f"[auth] {', '.join(dict.fromkeys(keys))}: {why}")
    return out


def check(settings: Settings) -> None:
    """Refuse to start a daemon whose key, certificate or keytab files are missing or unsafe.

    Raises:
        ConfigError: naming the config file, each bad ``[auth]`` key, its file and what is wrong.
    """
    found = problems(settings)
    if found:
        raise ConfigError(f"{settings.source or '<defaults>'}: {'; '.join(found)}")


def _file_problem(f: AuthFile) -> str:
    """Why the daemon should not be given ``f`` ('' when it is fine)."""
    try:
        st = os.lstat(f.path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be examined: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (not followed): name the file itself"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    why = _owner_problem(st, 0o077 if f.secret else 0o022)
    if why:
        fix = "chown root, chmod 0600" if f.secret else "chown root, chmod 0644"
        return f"{why} ({fix})"
    if st.st_size == 0:
        return "is empty"
    return ""


def _owner_problem(st: os.stat_result, forbidden: int) -> str:
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, not root"
    if mode & forbidden:
        what = "readable or writable" if forbidden & 0o044 else "writable"
        return f"is {what} by group or others (mode {mode:04o})"
    return ""


def _dir_problem(directory: Path) -> str:
    """Whoever may write the directory can replace the file: it must be root's alone (fsutil's rule)."""
    try:
        check_private_dir(directory)
    except OSError as exc:
        return f"directory {directory} {exc.strerror}: whoever may write it can replace the files"
    return ""
