"""NVML's GPU fabric structs, constants and calls, exactly as nvml.h declares them.

imexctl never trusts nvidia-ml-py's struct classes for fabric info: several
releases that ``setup.cfg`` allows declare them wrongly (12.535-12.575: the
cluster UUID is not a 16-byte array; 13.580-13.610: the legacy struct does not
match C).  This module defines the three C layouts itself and calls the C
functions through the library that pynvml loaded, passing pointers.

Source of every layout and constant unless noted: nvml.h as published in
NVIDIA/go-nvml, ``gen/nvml/nvml.h`` @ 2f9e261fe40a7a1c54783d66805e8920564763b4
(NVML API 13): ``nvmlGpuFabricInfo_t``, ``nvmlGpuFabricInfo_v2_t``,
``nvmlGpuFabricInfo_v3_t``, ``NVML_STRUCT_VERSION``, ``NVML_GPU_FABRIC_*``,
``nvmlReturn_t``.  ``GFM_STATE`` is newer than that header: NVML API reference
(docs.nvidia.com/deploy/nvml-api, group "Fabric definitions") and nvidia-ml-py
13.615.71 (shift 14, width 0x3).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Final, Optional

from imexctl.platform import Record

__all__ = [
    "FABRIC_INFO_V2",
    "FABRIC_INFO_V3",
    "RETURN_NAMES",
    "STATE_NAMES",
    "SUMMARY_NAMES",
    "FabricHealth",
    "FabricRead",
    "GpuFabricInfo",
    "GpuFabricInfoV2",
    "GpuFabricInfoV3",
    "NvmlCallError",
    "decode_health",
    "read_fabric",
    "return_name",
    "struct_version",
]

FABRIC_UUID_LEN: Final = 16  # NVML_GPU_FABRIC_UUID_LEN

# nvmlReturn_t (an enum: a C int)
SUCCESS: Final = 0
ERROR_NOT_SUPPORTED: Final = 3
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25
RETURN_NAMES: Final[dict[int, str]] = {
    0: "SUCCESS",
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    30: "RESET_TYPE_NOT_SUPPORTED",
    999: "UNKNOWN",
}

# NVML_GPU_FABRIC_STATE_*
STATE_NOT_SUPPORTED: Final = 0
STATE_NOT_STARTED: Final = 1
STATE_IN_PROGRESS: Final = 2
STATE_COMPLETED: Final = 3
STATE_NAMES: Final[dict[int, str]] = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}

# NVML_GPU_FABRIC_HEALTH_SUMMARY_* (v3 only)
SUMMARY_NOT_SUPPORTED: Final = 0
SUMMARY_HEALTHY: Final = 1
SUMMARY_UNHEALTHY: Final = 2
SUMMARY_LIMITED_CAPACITY: Final = 3
SUMMARY_NAMES: Final[dict[int, str]] = {0: "NOT_SUPPORTED", 1: "HEALTHY", 2: "UNHEALTHY", 3: "LIMITED_CAPACITY"}

_TRI = {0: "NOT_SUPPORTED", 1: "TRUE", 2: "FALSE"}
# NVML_GPU_FABRIC_HEALTH_MASK_<FIELD>_*: (field, SHIFT_<FIELD>, WIDTH_<FIELD>, values, {value: problem text})
_HEALTH_FIELDS: Final[tuple[tuple[str, int, int, dict[int, str], dict[int, str]], ...]] = (
    ("DEGRADED_BW", 0, 0x3, _TRI, {1: "NVLink bandwidth degraded"}),
    ("ROUTE_RECOVERY", 2, 0x3, _TRI, {1: "route recovery in progress"}),
    ("ROUTE_UNHEALTHY", 4, 0x3, _TRI, {1: "route unhealthy"}),
    ("ACCESS_TIMEOUT_RECOVERY", 6, 0x3, _TRI, {1: "access timeout recovery in progress"}),
    (
        "INCORRECT_CONFIGURATION",
        8,
        0xF,
        {
            0: "NOT_SUPPORTED",
            1: "NONE",
            2: "INCORRECT_SYSGUID",
            3: "INCORRECT_CHASSIS_SN",
            4: "NO_PARTITION",
            5: "INSUFFICIENT_NVLINKS",
            6: "INCOMPATIBLE_GPU_FW",
            7: "INVALID_LOCATION",
            8: "GPU_STATE_INVALID",
        },
        {
            2: "incorrect configuration: wrong system GUID",
            3: "incorrect configuration: wrong chassis serial number",
            4: "incorrect configuration: no partition",
            5: "incorrect configuration: insufficient NVLinks",
            6: "incorrect configuration: incompatible GPU firmware",
            7: "incorrect configuration: invalid location",
            8: "incorrect configuration: GPU state invalid",
        },
    ),
    ("PARTITION_ASSIGNED", 12, 0x3, _TRI, {2: "no fabric partition assigned"}),
    (
        "GFM_STATE",
        14,
        0x3,
        {0: "NOT_SUPPORTED", 1: "CONNECTED", 2: "DISCONNECTED"},
        {2: "global fabric manager disconnected"},
    ),
)
_KNOWN_MASK_BITS: Final = 0xFFFF


class GpuFabricInfo(ctypes.Structure):
    """``nvmlGpuFabricInfo_t``: the legacy (unversioned) struct of ``nvmlDeviceGetGpuFabricInfo``; 28 bytes."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * FABRIC_UUID_LEN),  # unsigned char[16]: raw bytes, may hold NULs
        ("status", ctypes.c_int),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint8),  # nvmlGpuFabricState_t = unsigned char
    ]


class GpuFabricInfoV2(ctypes.Structure):
    """``nvmlGpuFabricInfo_v2_t``: version first, healthMask last; 36 bytes."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * FABRIC_UUID_LEN),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint8),
        ("healthMask", ctypes.c_uint),
    ]


class GpuFabricInfoV3(ctypes.Structure):
    """``nvmlGpuFabricInfo_v3_t`` (= ``nvmlGpuFabricInfoV_t``): v2 plus healthSummary; 40 bytes."""

    _fields_ = [*GpuFabricInfoV2._fields_, ("healthSummary", ctypes.c_uint8)]


def struct_version(struct: type, ver: int) -> int:
    """``NVML_STRUCT_VERSION(data, ver)``: ``sizeof(struct) | ver << 24``."""
    return ctypes.sizeof(struct) | (ver << 24)


FABRIC_INFO_V2: Final = struct_version(GpuFabricInfoV2, 2)  # 0x02000024
FABRIC_INFO_V3: Final = struct_version(GpuFabricInfoV3, 3)  # 0x03000028


def return_name(code: int) -> str:
    """``NVML_ERROR_GPU_IS_LOST (15)`` for a known nvmlReturn_t, ``NVML return 4242`` otherwise."""
    name = RETURN_NAMES.get(code)
    if name is None:
        return f"NVML return {code}"
    return f"NVML_{'' if code == SUCCESS else 'ERROR_'}{name} ({code})"


class FabricHealth(Record):
    """A decoded ``healthMask`` / ``healthSummary`` (empty where the struct has no such field)."""

    summary: str
    fields: tuple[tuple[str, str], ...]
    problems: tuple[str, ...]

    def text(self) -> str:
        """One line for logs and errors, e.g. ``UNHEALTHY: route unhealthy``."""
        head = self.summary or "no health summary"
        return f"{head}: {', '.join(self.problems)}" if self.problems else head


def decode_health(mask: int | None, summary: int | None) -> FabricHealth:
    """Decode ``healthMask`` fields (``NVML_GPU_FABRIC_HEALTH_GET``) and ``healthSummary``.

    Args:
        mask: v2/v3 ``healthMask``, None for the legacy struct.
        summary: v3 ``healthSummary``, None for v2 and legacy.
    """
    summary_text = "" if summary is None else SUMMARY_NAMES.get(summary, f"UNKNOWN({summary})")
    if mask is None:
        return FabricHealth(summary_text, (), ())
    fields, problems = [], []
    for name, shift, width, values, bad in _HEALTH_FIELDS:
        raw = (mask >> shift) & width
        fields.append((name, values.get(raw, f"UNKNOWN({raw})")))
        if raw in bad:
            problems.append(bad[raw])
        elif raw not in values:
            problems.append(f"{name} has unknown value {raw}")
    if mask & ~_KNOWN_MASK_BITS:
        problems.append(f"unknown health mask bits {mask & ~_KNOWN_MASK_BITS:#x}")
    return FabricHealth(summary_text, tuple(fields), tuple(problems))


class FabricRead(Record):
    """One GPU's answer, whichever struct the driver accepted (``layout``: v3, v2 or legacy)."""

    layout: str
    cluster_uuid: bytes
    status: int
    clique_id: int
    state: int
    health_mask: int | None
    health_summary: int | None


class NvmlCallError(Exception):
    """An NVML fabric call returned an error other than "not supported"."""

    def __init__(self, gpu: int, function: str, layout: str, code: int) -> None:
        super().__init__(f"GPU {gpu}: {function} ({layout} struct) returned {return_name(code)}")
        self.gpu, self.function, self.layout, self.code = gpu, function, layout, code


# Lookup of a C symbol in the loaded libnvidia-ml: its address, or None when the library lacks it.
Lookup = Callable[[str], Optional[int]]
_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)  # nvmlReturn_t f(nvmlDevice_t, T *)
_VERSIONED = ((GpuFabricInfoV3, FABRIC_INFO_V3, "v3"), (GpuFabricInfoV2, FABRIC_INFO_V2, "v2"))


def read_fabric(lookup: Lookup, handle: Any, gpu: int) -> FabricRead | None:
    """Read one GPU's fabric info: ``...InfoV`` with v3, then v2, then the legacy call.

    Falls back on ``ARGUMENT_VERSION_MISMATCH`` (the driver does not know that
    version) and when a symbol is missing (``FUNCTION_NOT_FOUND``).

    Returns:
        The answer, or None when NVML says the GPU has no fabric (``NOT_SUPPORTED``).

    Raises:
        NvmlCallError: any other return code, or no fabric call in the library at all.
    """
    address = lookup("nvmlDeviceGetGpuFabricInfoV")
    if address is not None:
        call = _CALL(address)
        for struct, version, layout in _VERSIONED:
            info = struct(version=version)
            code = call(handle, ctypes.byref(info))
            if code != ERROR_ARGUMENT_VERSION_MISMATCH:
                return _result(gpu, "nvmlDeviceGetGpuFabricInfoV", layout, code, info)
    address = lookup("nvmlDeviceGetGpuFabricInfo")
    if address is None:
        raise NvmlCallError(gpu, "nvmlDeviceGetGpuFabricInfo", "legacy", ERROR_FUNCTION_NOT_FOUND)
    legacy = GpuFabricInfo()
    code = _CALL(address)(handle, ctypes.byref(legacy))
    return _result(gpu, "nvmlDeviceGetGpuFabricInfo", "legacy", code, legacy)


def _result(gpu: int, function: str, layout: str, code: int, info: Any) -> FabricRead | None:
    if code == ERROR_NOT_SUPPORTED:
        return None
    if code != SUCCESS:
        raise NvmlCallError(gpu, function, layout, code)
    return FabricRead(
        layout=layout,
        cluster_uuid=bytes(info.clusterUuid),
        status=int(info.status),
        clique_id=int(info.cliqueId),
        state=int(info.state),
        health_mask=int(info.healthMask) if layout != "legacy" else None,
        health_summary=int(info.healthSummary) if layout == "v3" else None,
    )
