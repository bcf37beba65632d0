"""The DCGM settings the packages ship (pkg/dcgm/), held to what DCGM, dcgm-exporter and NVSentinel do.

Each file keeps NVLink fault detection and leaves IMEX out where a setting can: on a tray with
imexctl DCGM reads the IMEX daemon as -3 all the time (tests/support/dcgm.py), so whatever health
system carries the IMEX check raises incident 122 there.  The facts are those recorded, with their
sources, in tests/data/dcgm/health.json; doctor (``imex.dcgm``) names the section of the tray's DCGM.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from imexctl.doctor import dcgm as doctor_dcgm
from tests.support import dcgm

PKG = Path(__file__).resolve().parents[1] / "pkg/dcgm"
#: the idle tray's reading: the ctl exits 255 for both questions (tests/sim/test_dcgm_view.py)
IDLE = dcgm.read((255, dcgm.NOT_CONFIGURED_TEXT), (255, dcgm.NOT_CONFIGURED_TEXT))
#: the recorded dcgmi versions whose letters each range's command must hold to; 4.7's dcgmi is not public,
#: so its command is held to 4.6.0's letters and may not use ``a`` (whose 4.7 systems nothing records)
TAGS = {"4.4 and before": ("4.4.2",), "4.5-4.6": ("4.5.0", "4.6.0"), "4.7 and later": ("4.6.0",)}
#: a version inside each range, and the first of the next, for the recorded IMEX spans
INSIDE = {"4.4 and before": ("4.4.2",), "4.5-4.6": ("4.5.0", "4.6.0", "4.6.1"), "4.7 and later": ("4.7.0", "5.0.0")}
BITS = dcgm.HEALTH["systems"]["bits"]


def _sections() -> dict[str, tuple[str, str]]:
    """dcgmi-health.txt: ``[range]`` headers, each with one command line and its comment lines."""
    out: dict[str, tuple[str, str]] = {}
    label = ""
    for line in (PKG / "dcgmi-health.txt").read_text().splitlines():
        header = re.fullmatch(r"\[(.+)\]", line)
        if header:
            label = header.group(1)
            assert label not in out, f"section [{label}] twice"
            out[label] = ("", "")
        elif label and line and not line.startswith("#"):
            assert not out[label][0], f"[{label}] has more than one command: {line!r}"
            out[label] = (line, out[label][1])
        elif label and line.startswith("#"):
            out[label] = (out[label][0], out[label][1] + line[1:])
    return out


def _letters(command: str) -> str:
    found = re.fullmatch(r"dcgmi health -s ([a-z]+)", command)
    assert found, f"not a dcgmi health -s line: {command!r}"
    return found.group(1)


# ---------------------------------------------------------------- dcgmi health -s, per DCGM version range


def test_one_section_per_range_doctor_names_with_the_command_doctor_prints() -> None:
    sections = _sections()
    assert list(sections) == [span.label for span in doctor_dcgm.SPANS]
    for span in doctor_dcgm.SPANS:
        assert sections[span.label][0] == span.command


@pytest.mark.parametrize("label", list(TAGS))
def test_each_command_is_one_every_dcgmi_of_its_range_takes_and_it_keeps_nvlink(label: str) -> None:
    letters = _letters(_sections()[label][0])
    for tag in TAGS[label]:
        assert dcgm.letters_mask(tag, letters) & BITS["NVLINK"], f"[{label}] drops NVLink with dcgmi {tag}"


def test_the_recorded_letters_refuse_what_dcgmi_refuses() -> None:
    """The model the commands are held to: 4.5.0's dcgmi has no x, 4.4.2's no d; a goes alone, no letter twice."""
    for tag, letters in (("4.5.0", "pmitdnx"), ("4.4.2", "pmitdn"), ("4.6.0", "an"), ("4.6.0", "nn")):
        with pytest.raises(ValueError, match="flags detected"):
            dcgm.letters_mask(tag, letters)
    assert dcgm.letters_mask("4.6.0", "pmitdnx") == sum(
        BITS[s] for s in ("PCIE", "MEM", "INFOROM", "THERMAL", "POWER", "DRIVER", "NVLINK", "CONNECTX")
    )


@pytest.mark.parametrize("label", list(INSIDE))
def test_imex_is_left_out_wherever_a_setting_can_leave_it_out(label: str) -> None:
    """4.7+: the command's systems miss the IMEX one, so an idle tray raises nothing.  4.5-4.6: the NVLink
    watch carries the check, nothing can leave it out, and the section says to keep NVLink and leave
    incident 122 out of automated actions.  Before 4.5 there is no check to leave out."""
    command, comment = _sections()[label]
    letters = _letters(command)
    for text in INSIDE[label]:
        tag = TAGS[label][-1]
        raised = dcgm.raises_122(dcgm.version(text), dcgm.letters_mask(tag, letters), IDLE)
        if dcgm.imex_system(dcgm.version(text)) == "NVLINK":
            assert raised == "NVLINK"
            assert "122" in comment and "Keep n" in comment
        else:
            assert raised is None, f"DCGM {text}: {command} raises incident 122 on an idle tray"
    if label == "4.7 and later":
        assert "a" not in letters


# ---------------------------------------------------------------- dcgm-exporter


def _counters() -> list[list[str]]:
    """The CSV as dcgm-exporter reads it: '#' lines are comments, each record is 3 fields, blanks trimmed."""
    lines = [line for line in (PKG / "dcgm-exporter-counters.csv").read_text().splitlines() if line.strip()]
    rows = list(csv.reader(line for line in lines if not line.startswith("#")))
    for row in rows:
        assert len(row) == 3, f"expected 3 fields: {row}"
    return [[field.strip() for field in row] for row in rows]


def test_the_counters_parse_as_dcgm_exporter_reads_them_and_name_only_known_fields() -> None:
    exporter = dcgm.HEALTH["dcgm_exporter"]
    rows = _counters()
    for name, kind, text in rows:
        assert name in exporter["fields"] or name in exporter["exporter_counters"], f"unknown field {name}"
        assert kind in exporter["types"], f"{name}: type {kind}"
        assert text.endswith(".")
    names = [row[0] for row in rows]
    assert len(set(names)) == len(names)
    assert any("NVLINK" in name for name in names) and "DCGM_EXP_GPU_HEALTH_STATUS" in names


def test_the_counters_leave_the_imex_fields_out_and_say_so() -> None:
    exporter = dcgm.HEALTH["dcgm_exporter"]
    names = {row[0] for row in _counters()}
    ids = {exporter["fields"][name] for name in names if name in exporter["fields"]}
    assert not names & set(exporter["imex_fields"]) and not ids & {1502, 1503}
    text = (PKG / "dcgm-exporter-counters.csv").read_text()
    for name in exporter["imex_fields"]:
        assert f"{name} ({exporter['fields'][name]})" in text


# ---------------------------------------------------------------- NVSentinel


def _values() -> dict[str, str]:
    """The YAML's block mappings as dotted keys (the file holds nothing else: two-space indents, scalars)."""
    out: dict[str, str] = {}
    path: list[str] = []
    for line in (PKG / "nvsentinel-values.yaml").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent // 2 <= len(path), f"bad indent: {line!r}"
        key, _, value = line.strip().partition(":")
        path = [*path[: indent // 2], key]
        if value.strip():
            out[".".join(path)] = value.strip()
    return out


def test_the_nvsentinel_values_turn_imex_monitoring_off_by_a_key_the_chart_has() -> None:
    keys = dcgm.HEALTH["nvsentinel"]["keys"]
    values = _values()
    assert values == {"gpu-health-monitor.dcgmHealthCheck.imexMonitoringEnabled": "false"}
    assert all(keys[key] == "bool" for key in values)
    older = next(key for key in keys if key.endswith("suppressedErrorCodes"))
    assert older in (PKG / "nvsentinel-values.yaml").read_text()
