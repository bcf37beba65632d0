"""IMEX channel device nodes: ``/proc/devices`` parsing and per-job channels.

The channel file is the security boundary (design.md source channels): the job gets exactly
one channel, owned by the job's user with a restrictive mode, with the same
minor on every tray of the job, and it is removed in the epilog.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from imexctl.platform import Record
from imexctl.platform.errors import DeviceError
from imexctl.platform.fsutil import ensure_dir, read_text_nofollow

__all__ = [
    "DEVICE_NAME",
    "Channel",
    "channel_minor",
    "check_minor",
    "driver_channel_count",
    "find_major",
    "list_channels",
    "parse_channel_count",
    "remove_channel",
]

DEVICE_NAME = "nvidia-caps-imex-channels"


class Channel(Record):
    """One channel node as found on disk."""

    path: Path
    minor: int
    major: int
    uid: int
    gid: int
    mode: int


def find_major(proc_devices_text: str, name: str = DEVICE_NAME, *, source: str = "/proc/devices") -> int | None:
    """Major number of ``name`` in the ``Character devices:`` section, or None.

    Exact name match only: ``nvidia-caps`` is a different device (design.md source proc-devices).
    ``source`` names the file in errors.

    Raises:
        DeviceError: the text does not look like /proc/devices, or names the device twice.
    """
    section = None
    found: list[int] = []
    for line in proc_devices_text.splitlines():
        stripped = line.strip()
        if stripped in ("Character devices:", "Block devices:"):
            section = stripped
            continue
        if not stripped or section != "Character devices:":
            continue
        number, _, dev = stripped.partition(" ")
        if dev.strip() == name:
            if not number.isdigit():
                raise DeviceError(f"{source}: malformed line {line!r}")
            found.append(int(number))
    if section is None:
        raise DeviceError(f"{source}: no 'Character devices:' section")
    if len(found) > 1:
        raise DeviceError(
            f"{source}: {name} listed {len(found)} times (majors {', '.join(map(str, found))}): "
            "which one the driver uses is unknown"
        )
    return found[0] if found else None


def channel_minor(job_id: int, channel_count: int, position: int = 0, clique: int = 1) -> int:
    """The channel number of a job's IMEX domain: the same on each of its trays, never 0 (design.md "The channel rule").

    IMEX domains that run at once in one NVLink clique must use different
    channels (design.md source channel-per-domain).  Two of them never share a
    tray, so the first trays of their domains differ: ``position`` is where the
    domain's first tray stands among the ``clique`` trays of its clique (from 0).
    While ``clique`` is below ``channel_count``, positions give distinct numbers
    whatever the job ids, and the job id moves the number on by ``clique`` from
    one job to the next on the same trays (``channel_count // clique`` turns).
    A larger clique wraps: numbers then repeat every ``channel_count - 1``
    positions.  ``position`` 0 of a clique of 1 is the job-id rule,
    ``1 + job_id % (channel_count - 1)``.
    """
    span = channel_count - 1
    turns = max(1, span // clique)
    return 1 + (position + clique * (job_id % turns)) % span


def read_major(proc_devices: Path) -> int:
    """The IMEX channel major from the node's /proc/devices.

    Raises:
        DeviceError: naming the file: it is unreadable, or has no IMEX entry or two.
    """
    try:
        text = read_text_nofollow(proc_devices)
    except OSError as exc:
        raise DeviceError(f"cannot read {proc_devices}: {exc.strerror}") from exc
    major = find_major(text, source=str(proc_devices))
    if major is None:
        raise DeviceError(
            f"{proc_devices} has no {DEVICE_NAME} entry: the NVIDIA driver is not loaded "
            "or IMEX channels are disabled (NVreg_ImexChannelCount=0)"
        )
    return major


def parse_channel_count(params_text: str) -> int | None:
    """``NVreg_ImexChannelCount`` from the text of ``/proc/driver/nvidia/params``, or None.

    The driver prints each module parameter as ``Name: value``; the channel
    count is the line ``ImexChannelCount: N`` (read the same way by gVisor's
    nvproxy, google/gvisor ``pkg/sentry/devices/nvproxy``, ``IMEXChannelCount``).

    Raises:
        DeviceError: the line is present but its value is not a number.
    """
    for line in params_text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "ImexChannelCount":
            if not value.strip().isdigit():
                raise DeviceError(f"/proc/driver/nvidia/params: malformed line {line!r}")
            return int(value.strip())
    return None


def driver_channel_count(params: Path) -> int | None:
    """The loaded driver's ``ImexChannelCount``; None when the file or the line is absent."""
    try:
        text = read_text_nofollow(params)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DeviceError(f"cannot read {params}: {exc.strerror}") from exc
    return parse_channel_count(text)


def check_minor(minor: int, driver_count: int | None, configured_count: int) -> None:
    """Refuse a channel minor the driver does not have, before anything is created.

    Raises:
        DeviceError: ``minor`` is not below the driver's ``NVreg_ImexChannelCount``.
    """
    if driver_count is None or minor < driver_count:
        return
    raise DeviceError(
        f"channel minor {minor} is out of range: the driver has NVreg_ImexChannelCount={driver_count} "
        f"(channels 0..{driver_count - 1}) but [policy] channel_count = {configured_count}; "
        f"set channel_count to at most {driver_count}"
    )


def channel_path(channel_dir: Path, minor: int) -> Path:
    """``<channel_dir>/channel<minor>``."""
    return channel_dir / f"channel{minor}"


def ensure_channel_dir(channel_dir: Path) -> None:
    """Create the channel directory (0755) and refuse one that anybody but us (root) can write."""
    try:
        ensure_dir(channel_dir, 0o755)
        st = os.lstat(channel_dir)
    except OSError as exc:
        raise DeviceError(f"cannot create {channel_dir}: {exc.strerror}") from exc
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise DeviceError(f"{channel_dir} must be owned by root and not group/world writable")


def list_channels(channel_dir: Path) -> list[Channel]:
    """Every ``channel<N>`` character device in the directory, sorted by minor."""
    out = []
    try:
        entries = list(os.scandir(channel_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.startswith("channel"):
            continue
        st = os.lstat(entry.path)
        if stat.S_ISCHR(st.st_mode):
            out.append(
                Channel(
                    Path(entry.path),
                    os.minor(st.st_rdev),
                    os.major(st.st_rdev),
                    st.st_uid,
                    st.st_gid,
                    stat.S_IMODE(st.st_mode),
                )
            )
    return sorted(out, key=lambda c: c.minor)


def remove_channel(path: Path, minor: int) -> bool:
    """Remove the job's channel node if it is the character device we expect.

    Returns:
        True if a node was removed.

    Raises:
        DeviceError: something else sits at that path, or unlink failed.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISCHR(st.st_mode) or os.minor(st.st_rdev) != minor:
        raise DeviceError(f"{path} is not the expected channel device (minor {minor}); left alone")
    try:
        os.unlink(path)
    except OSError as exc:
        raise DeviceError(f"cannot remove {path}: {exc.strerror}") from exc
    return True
