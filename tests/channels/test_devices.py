"""devices: /proc/devices parsing, the job's channel number, and channel nodes on disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imexctl.channels.devices import (
    Channel,
    channel_minor,
    channel_path,
    ensure_channel_dir,
    find_major,
    list_channels,
    read_major,
    remove_channel,
)
from imexctl.platform.errors import DeviceError
from tests.support.privileges import needs_chown, needs_mknod

PROC = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
{char}
Block devices:
  7 loop
{block}
"""


def mkchr(path: Path, major: int, minor: int, mode: int = 0o600) -> Path:
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod honours the umask
    return path


class TestFindMajor:
    @pytest.mark.parametrize(
        ("char", "block", "major"),
        [
            pytest.param("234 nvidia-caps-imex-channels", "", 234, id="present"),
            pytest.param("235 nvidia-caps\n234 nvidia-caps-imex-channels", "", 234, id="after-nvidia-caps"),
            pytest.param("234 nvidia-caps-imex-channels\n235 nvidia-caps", "", 234, id="before-nvidia-caps"),
            pytest.param("235 nvidia-caps", "", None, id="only-nvidia-caps"),
            pytest.param("236 nvidia-caps-imex-channels-v2", "", None, id="longer-name"),
            pytest.param("237 my-nvidia-caps-imex-channels", "", None, id="name-suffix"),
            pytest.param("", "238 nvidia-caps-imex-channels", None, id="block-section-only"),
            pytest.param("", "", None, id="absent"),
        ],
    )
    def test_exact_name_in_character_section(self, char: str, block: str, major: int | None) -> None:
        """Only the exact name in the Character devices section counts."""
        assert find_major(PROC.format(char=char, block=block)) == major

    def test_duplicate_entry_is_an_error(self) -> None:
        """Two character entries with the IMEX name are refused."""
        text = PROC.format(char="234 nvidia-caps-imex-channels\n240 nvidia-caps-imex-channels", block="")
        with pytest.raises(DeviceError, match="listed 2 times"):
            find_major(text)

    def test_missing_character_section_is_an_error(self) -> None:
        """Text without a 'Character devices:' header is not /proc/devices."""
        with pytest.raises(DeviceError, match="no 'Character devices:' section"):
            find_major("234 nvidia-caps-imex-channels\n")

    def test_other_name_can_be_asked_for(self) -> None:
        """The device name is a parameter; nvidia-caps is found by its own exact name."""
        text = PROC.format(char="235 nvidia-caps\n234 nvidia-caps-imex-channels", block="")
        assert find_major(text, "nvidia-caps") == 235

    def test_read_major_without_entry_explains_why(self, tmp_path: Path) -> None:
        """A /proc/devices without the IMEX entry is an error that names the likely causes."""
        (tmp_path / "devices").write_text(PROC.format(char="", block=""))
        with pytest.raises(DeviceError, match="NVreg_ImexChannelCount=0"):
            read_major(tmp_path / "devices")

    def test_read_major_unreadable_file(self, tmp_path: Path) -> None:
        """A missing /proc/devices is a DeviceError naming the path."""
        with pytest.raises(DeviceError, match=f"cannot read {tmp_path}/devices"):
            read_major(tmp_path / "devices")

    def test_read_major_from_file(self, tmp_path: Path) -> None:
        """The major is read from the file at the given path."""
        (tmp_path / "devices").write_text(PROC.format(char="509 nvidia-caps-imex-channels", block=""))
        assert read_major(tmp_path / "devices") == 509


class TestChannelMinor:
    @pytest.mark.parametrize("job_id", [1, 2046, 2047, 2048, 4094, 4095, 10**9 + 7])
    def test_never_zero_and_within_count(self, job_id: int) -> None:
        """The minor is never channel 0 (shared by convention) and below channel_count."""
        assert 1 <= channel_minor(job_id, 2048) <= 2047

    def test_all_jobs_never_hit_zero(self) -> None:
        """Over a full cycle of job ids no job gets channel 0 and every other channel is used."""
        assert {channel_minor(j, 16) for j in range(1, 100)} == set(range(1, 16))

    def test_identical_for_a_job_id(self) -> None:
        """The minor is a pure function of its inputs, so every tray computes the same one; at position 0 of a
        clique of one (no place) it is the job-id rule."""
        assert channel_minor(123456, 2048) == channel_minor(123456, 2048, 0, 1) == 1 + 123456 % 2047

    @given(
        clique=st.integers(2, 2047),
        data=st.data(),
        jobs=st.tuples(st.integers(1, 2**32 - 1), st.integers(1, 2**32 - 1)),
    )
    def test_domains_at_different_positions_never_share_a_channel(
        self, clique: int, data: st.DataObject, jobs: tuple[int, int]
    ) -> None:
        """Two domains running at once in one clique have different first trays: whatever their job ids, their
        numbers differ while the clique is below channel_count (2048), and never leave 1..2047."""
        first = data.draw(st.integers(0, clique - 1))
        second = data.draw(st.integers(0, clique - 1).filter(lambda p: p != first))
        a, b = channel_minor(jobs[0], 2048, first, clique), channel_minor(jobs[1], 2048, second, clique)
        assert a != b and 1 <= a <= 2047 and 1 <= b <= 2047

    def test_job_ids_a_multiple_of_2047_apart_no_longer_collide(self) -> None:
        """The job-id rule gave jobs 610 and 2657 (610 + 2047) the same channel; on two trays of one rack they do
        not share one any more."""
        assert channel_minor(610, 2048) == channel_minor(2657, 2048) == 611
        assert channel_minor(610, 2048, 0, 18) != channel_minor(2657, 2048, 9, 18)

    def test_the_next_job_on_the_same_trays_gets_another_number(self) -> None:
        """The job id turns the number over by the clique's size: an 18-tray rack has 113 numbers per position."""
        got = [channel_minor(j, 2048, 4, 18) for j in range(1000, 1113)]
        assert len(set(got)) == 113 and {(m - 1) % 18 for m in got} == {4}
        assert channel_minor(1113, 2048, 4, 18) == got[0]

    @pytest.mark.parametrize(("count", "clique"), [(16, 40), (2048, 4096), (2, 18)])
    def test_a_clique_larger_than_the_channels_wraps(self, count: int, clique: int) -> None:
        """More trays than channels: positions wrap (never 0, never count), the job id no longer counts."""
        got = {channel_minor(j, count, p, clique) for p in range(clique) for j in (7, 8)}
        assert got == set(range(1, count))
        assert channel_minor(7, count, count - 1, clique) == 1

    def test_two_channels_means_always_one(self) -> None:
        """With channel_count 2 every job gets channel 1."""
        assert {channel_minor(j, 2) for j in range(1, 20)} == {1}

    def test_path_is_channel_n(self, tmp_path: Path) -> None:
        """The node path is <dir>/channel<minor>."""
        assert channel_path(tmp_path, 43) == tmp_path / "channel43"


class TestEnsureChannelDir:
    def test_creates_root_owned_0755(self, tmp_path: Path) -> None:
        """A missing directory is created 0755, owned by root."""
        d = tmp_path / "dev" / "nvidia-caps-imex-channels"
        old = os.umask(0o022)
        try:
            ensure_channel_dir(d)
        finally:
            os.umask(old)
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755

    def test_refuses_symlink(self, tmp_path: Path) -> None:
        """A symlink in place of the directory is refused."""
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "chan").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(DeviceError, match="cannot create"):
            ensure_channel_dir(tmp_path / "chan")

    @pytest.mark.parametrize("mode", [pytest.param(0o777, id="world"), pytest.param(0o775, id="group")])
    def test_refuses_writable_by_others(self, tmp_path: Path, mode: int) -> None:
        """A directory that group or others may write is refused."""
        d = tmp_path / "chan"
        d.mkdir()
        os.chmod(d, mode)
        with pytest.raises(DeviceError, match="not group/world writable"):
            ensure_channel_dir(d)

    @needs_chown
    def test_refuses_directory_not_owned_by_root(self, tmp_path: Path) -> None:
        """A directory owned by another uid is refused."""
        d = tmp_path / "chan"
        d.mkdir(mode=0o755)
        os.chown(d, 65534, 65534)
        with pytest.raises(DeviceError, match="must be owned by root"):
            ensure_channel_dir(d)


class TestListChannels:
    @needs_mknod
    def test_lists_character_devices_sorted_by_minor(self, tmp_path: Path) -> None:
        """Only channel* character devices are listed, sorted by minor, with owner and mode."""
        mkchr(tmp_path / "channel7", 234, 7, 0o600)
        mkchr(tmp_path / "channel0", 234, 0, 0o666)
        os.chown(mkchr(tmp_path / "channel12", 234, 12, 0o640), 1234, 1235)
        (tmp_path / "channel9").write_text("not a device")
        mkchr(tmp_path / "other3", 234, 3)
        (tmp_path / "channel5").symlink_to(tmp_path / "channel7")
        found = list_channels(tmp_path)
        assert found == [
            Channel(tmp_path / "channel0", 0, 234, 0, 0, 0o666),
            Channel(tmp_path / "channel7", 7, 234, 0, 0, 0o600),
            Channel(tmp_path / "channel12", 12, 234, 1234, 1235, 0o640),
        ]

    def test_missing_directory_is_empty(self, tmp_path: Path) -> None:
        """A missing channel directory means no channels."""
        assert list_channels(tmp_path / "nope") == []


class TestRemoveChannel:
    @needs_mknod
    def test_removes_expected_device(self, tmp_path: Path) -> None:
        """The job's character device with the expected minor is removed."""
        path = mkchr(tmp_path / "channel43", 234, 43)
        assert remove_channel(path, 43) is True
        assert not os.path.lexists(path)

    def test_missing_is_false(self, tmp_path: Path) -> None:
        """A channel that is already gone is not an error."""
        assert remove_channel(tmp_path / "channel43", 43) is False

    def test_refuses_regular_file(self, tmp_path: Path) -> None:
        """A regular file at the channel path is left alone and reported."""
        (tmp_path / "channel43").write_text("x")
        with pytest.raises(DeviceError, match="not the expected channel device"):
            remove_channel(tmp_path / "channel43", 43)
        assert (tmp_path / "channel43").read_text() == "x"

    @needs_mknod
    def test_refuses_wrong_minor(self, tmp_path: Path) -> None:
        """A device with another minor is another job's channel and is left alone."""
        path = mkchr(tmp_path / "channel43", 234, 44)
        with pytest.raises(DeviceError, match="minor 43"):
            remove_channel(path, 43)
        assert os.path.lexists(path)

    @needs_mknod
    def test_refuses_symlink(self, tmp_path: Path) -> None:
        """A symlink to a matching device is not followed and not removed."""
        target = mkchr(tmp_path / "real", 234, 43)
        (tmp_path / "channel43").symlink_to(target)
        with pytest.raises(DeviceError):
            remove_channel(tmp_path / "channel43", 43)
        assert os.path.lexists(tmp_path / "channel43") and os.path.lexists(target)
