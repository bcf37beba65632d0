"""gpu and nvml: the clique rule (design.md source nvml-clique), the fabric wait and health policy, nvml.h's layouts.

The NVML calls themselves run against a stand-in library in tests/gpu/test_nvml.py.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.config import settings
from imexctl.gpu import nvml
from imexctl.gpu.fabric import FABRIC_POLL_S, FabricInfo, NvmlGpu, clique_key, fabric_key
from imexctl.platform.errors import GpuError
from tests.support.fakes import FakeGpu

UUID_A = bytes(range(1, 17))
UUID_B = b"\xbb" * 16
ZERO = bytes(16)
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3


def fi(
    index: int = 0, uuid: bytes = UUID_A, clique: int = 7, state: int = COMPLETED, status: int = 0, **health: Any
) -> FabricInfo:
    return FabricInfo(index, uuid, clique, state, status, **health)


class TestCliqueKey:
    def test_key_format_is_uuid_dot_clique(self) -> None:
        """The key is the canonical UUID text, a dot, and the clique id in decimal."""
        assert clique_key([fi(0), fi(1)]) == "01020304-0506-0708-090a-0b0c0d0e0f10.7"

    @pytest.mark.parametrize(
        ("infos", "key"),
        [
            pytest.param([], None, id="no-gpus"),
            pytest.param([None, None], None, id="all-unsupported-none"),
            pytest.param([fi(state=NOT_SUPPORTED, status=5)], None, id="state-not-supported"),
            pytest.param([fi(uuid=ZERO), fi(1, uuid=ZERO)], None, id="zero-uuid"),
            pytest.param(
                [None, fi(1), fi(2, state=NOT_SUPPORTED)],
                "01020304-0506-0708-090a-0b0c0d0e0f10.7",
                id="unsupported-skipped",
            ),
            pytest.param([fi(0, uuid=ZERO), fi(1)], "01020304-0506-0708-090a-0b0c0d0e0f10.7", id="zero-skipped"),
            pytest.param([fi(0, clique=0)], "01020304-0506-0708-090a-0b0c0d0e0f10.0", id="clique-zero"),
        ],
    )
    def test_table(self, infos: list[FabricInfo | None], key: str | None) -> None:
        """GPUs without fabric support or with an all-zero cluster UUID do not form a clique."""
        assert clique_key(infos) == key

    @pytest.mark.parametrize("state", [NOT_STARTED, IN_PROGRESS, 7])
    def test_not_completed_is_an_error(self, state: int) -> None:
        """A GPU whose registration is not COMPLETED fails, naming the GPU and the state."""
        name = {NOT_STARTED: "NOT_STARTED", IN_PROGRESS: "IN_PROGRESS", 7: "UNKNOWN\\(7\\)"}[state]
        with pytest.raises(GpuError, match=f"GPU 2: NVLink fabric not attached \\(state {name}\\)"):
            clique_key([fi(0), fi(2, state=state)])

    def test_failed_registration_is_an_error(self) -> None:
        """A COMPLETED registration with a non-zero NVML status fails, naming the status."""
        with pytest.raises(GpuError, match=r"GPU 1: NVLink fabric registration error \(NVML_ERROR_UNKNOWN \(999\)\)"):
            clique_key([fi(0), fi(1, status=999)])

    def test_error_even_with_zero_uuid(self) -> None:
        """A failed registration counts even when the UUID is all zero."""
        with pytest.raises(GpuError):
            clique_key([fi(0, uuid=ZERO, status=3)])

    @pytest.mark.parametrize(
        "other",
        [pytest.param(fi(1, uuid=UUID_B), id="two-uuids"), pytest.param(fi(1, clique=8), id="two-clique-ids")],
    )
    def test_two_cliques_are_an_error(self, other: FabricInfo) -> None:
        """GPUs of one tray in two cliques are refused, listing both keys."""
        with pytest.raises(GpuError, match=r"several NVLink cliques: .*\..*, .*\."):
            clique_key([fi(0), other])


# ---------------------------------------------------------------- nvml.h layouts (values from nvml.h)


class TestLayouts:
    @pytest.mark.parametrize(
        ("struct", "size", "offsets"),
        [
            pytest.param(
                nvml.GpuFabricInfo, 28, {"clusterUuid": 0, "status": 16, "cliqueId": 20, "state": 24}, id="legacy"
            ),
            pytest.param(
                nvml.GpuFabricInfoV2,
                36,
                {"version": 0, "clusterUuid": 4, "status": 20, "cliqueId": 24, "state": 28, "healthMask": 32},
                id="v2",
            ),
            pytest.param(
                nvml.GpuFabricInfoV3,
                40,
                {
                    "version": 0,
                    "clusterUuid": 4,
                    "status": 20,
                    "cliqueId": 24,
                    "state": 28,
                    "healthMask": 32,
                    "healthSummary": 36,
                },
                id="v3",
            ),
        ],
    )
    def test_struct_matches_nvml_h(self, struct: Any, size: int, offsets: dict[str, int]) -> None:
        """Each ctypes struct has nvml.h's size and field offsets (unsigned char state, 16-byte UUID)."""
        assert ctypes.sizeof(struct) == size
        assert {name: getattr(struct, name).offset for name, _ in struct._fields_} == offsets
        assert struct.clusterUuid.size == 16 and struct.state.size == 1

    def test_versions_are_nvml_struct_version(self) -> None:
        """nvmlGpuFabricInfo_v2/_v3 are sizeof | ver << 24, as NVML_STRUCT_VERSION computes them."""
        assert (nvml.FABRIC_INFO_V2, nvml.FABRIC_INFO_V3) == (0x02000024, 0x03000028)

    def test_uuid_keeps_every_byte(self) -> None:
        """A UUID with NUL and high bytes reads back as all 16 bytes (no C string semantics)."""
        info = nvml.GpuFabricInfoV3(version=nvml.FABRIC_INFO_V3)
        ctypes.memmove(ctypes.addressof(info) + 4, b"\x00\xff" * 8, 16)
        assert bytes(info.clusterUuid) == b"\x00\xff" * 8

    @pytest.mark.parametrize(
        ("code", "text"),
        [(0, "NVML_SUCCESS (0)"), (25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25)"), (4242, "NVML return 4242")],
    )
    def test_return_names(self, code: int, text: str) -> None:
        """Return codes are named as nvml.h names them, unknown ones by number."""
        assert nvml.return_name(code) == text


# ---------------------------------------------------------------- health decoding

OK_MASK = 0x2 | 0x2 << 2 | 0x2 << 4 | 0x2 << 6 | 0x1 << 8 | 0x1 << 12 | 0x1 << 14


class TestDecodeHealth:
    def test_healthy_mask_has_no_problems(self) -> None:
        """A mask whose every field says "no problem" decodes field by field and lists no problem."""
        health = nvml.decode_health(OK_MASK, 1)
        assert health.problems == () and health.text() == "HEALTHY"
        assert dict(health.fields) == {
            "DEGRADED_BW": "FALSE",
            "ROUTE_RECOVERY": "FALSE",
            "ROUTE_UNHEALTHY": "FALSE",
            "ACCESS_TIMEOUT_RECOVERY": "FALSE",
            "INCORRECT_CONFIGURATION": "NONE",
            "PARTITION_ASSIGNED": "TRUE",
            "GFM_STATE": "CONNECTED",
        }

    @pytest.mark.parametrize(
        ("shift", "width", "value", "problem"),
        [
            pytest.param(0, 0x3, 1, "NVLink bandwidth degraded", id="degraded-bw"),
            pytest.param(2, 0x3, 1, "route recovery in progress", id="route-recovery"),
            pytest.param(4, 0x3, 1, "route unhealthy", id="route-unhealthy"),
            pytest.param(6, 0x3, 1, "access timeout recovery in progress", id="access-timeout"),
            pytest.param(8, 0xF, 2, "incorrect configuration: wrong system GUID", id="sysguid"),
            pytest.param(8, 0xF, 5, "incorrect configuration: insufficient NVLinks", id="nvlinks"),
            pytest.param(8, 0xF, 8, "incorrect configuration: GPU state invalid", id="gpu-state"),
            pytest.param(8, 0xF, 9, "INCORRECT_CONFIGURATION has unknown value 9", id="config-unknown"),
            pytest.param(12, 0x3, 2, "no fabric partition assigned", id="no-partition"),
            pytest.param(14, 0x3, 2, "global fabric manager disconnected", id="gfm"),
            pytest.param(0, 0x3, 3, "DEGRADED_BW has unknown value 3", id="bw-unknown"),
        ],
    )
    def test_each_field(self, shift: int, width: int, value: int, problem: str) -> None:
        """Each field is read at nvml.h's shift and width; its bad values become a readable problem."""
        mask = OK_MASK & ~(width << shift) | value << shift
        assert nvml.decode_health(mask, 2).problems == (problem,)

    def test_unknown_bits_are_reported(self) -> None:
        """Bits above the known fields are listed, not dropped."""
        assert nvml.decode_health(OK_MASK | 1 << 20, 1).problems == ("unknown health mask bits 0x100000",)

    @pytest.mark.parametrize(
        ("mask", "summary", "text"),
        [
            (None, None, "no health summary"),
            (0, None, "no health summary"),
            (OK_MASK, 3, "LIMITED_CAPACITY"),
            (OK_MASK, 9, "UNKNOWN(9)"),
        ],
    )
    def test_layouts_without_fields(self, mask: int | None, summary: int | None, text: str) -> None:
        """Legacy has no mask, v2 no summary; an unknown summary value is shown as such."""
        assert nvml.decode_health(mask, summary).text() == text


# ---------------------------------------------------------------- fabric_key: wait and health policy


class Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []  # type: float, List[float]

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def policy(**kw: Any) -> Any:
    cfg = settings.load(None, node="t")
    return cfg.replace(**{f"policy__{k}": v for k, v in kw.items()})


def tray(**changes: Any) -> list[FabricInfo | None]:
    """Four healthy v3 GPUs in one clique; ``changes`` = {index: {field: value}}."""
    return [
        fi(i, health_mask=OK_MASK, health_summary=1, layout="v3")._replace(**changes.get(f"g{i}", {})) for i in range(4)
    ]


class TestFabricKey:
    def test_healthy_tray(self) -> None:
        """A healthy registered tray gives its key at once and logs one debug line with every GPU."""
        clock = Clock()
        with capture_logs() as logs:
            key = fabric_key(FakeGpu(infos=tray()), clock, policy(), deadline=60, log=structlog.get_logger())
        assert key == "01020304-0506-0708-090a-0b0c0d0e0f10.7" and clock.slept == []
        assert [(e["event"], e["log_level"]) for e in logs] == [("gpu.fabric.read", "debug")]
        assert logs[0]["gpus"][0] == {
            "gpu": 0,
            "state": "COMPLETED",
            "status": "NVML_SUCCESS (0)",
            "clique_id": 7,
            "cluster_uuid": "01020304-0506-0708-090a-0b0c0d0e0f10",
            "layout": "v3",
            "health": "HEALTHY",
        }

    def test_pending_then_completed(self) -> None:
        """A registration IN_PROGRESS is asked again every second; one info line says so."""
        gpu = FakeGpu(infos=tray(g2={"state": IN_PROGRESS}), then=[tray(g2={"state": IN_PROGRESS}), tray()])
        clock = Clock()
        with capture_logs() as logs:
            key = fabric_key(gpu, clock, policy(), deadline=60, log=structlog.get_logger())
        assert key is not None and gpu.calls == 3 and clock.slept == [FABRIC_POLL_S] * 2
        waiting = [e for e in logs if e["event"] == "gpu.fabric.waiting"]
        assert len(waiting) == 1 and waiting[0]["gpus"] == {2: "IN_PROGRESS"} and waiting[0]["log_level"] == "info"

    def test_wait_ends_at_the_deadline(self) -> None:
        """The wait stops at the prolog's deadline when that comes before fabric_wait_s."""
        clock = Clock()
        with pytest.raises(GpuError, match=r"GPU 1: .*still NOT_STARTED after 2\.5 s"):
            fabric_key(
                FakeGpu(infos=tray(g1={"state": NOT_STARTED})),
                clock,
                policy(fabric_wait_s=20.0),
                deadline=2.5,
                log=structlog.get_logger(),
            )
        assert clock.slept == [1.0, 1.0, 0.5]

    def test_zero_wait_fails_at_once(self) -> None:
        """fabric_wait_s = 0 refuses a pending registration without sleeping (DRA strict mode)."""
        clock = Clock()
        with pytest.raises(GpuError, match="still IN_PROGRESS after 0.0 s"):
            fabric_key(
                FakeGpu(infos=tray(g0={"state": IN_PROGRESS})),
                clock,
                policy(fabric_wait_s=0.0),
                deadline=60,
                log=structlog.get_logger(),
            )
        assert clock.slept == []

    def test_unhealthy_fails_with_reason(self) -> None:
        """UNHEALTHY names the GPU, the decoded problems and the raw mask."""
        mask = OK_MASK & ~(0x3 << 4) | 1 << 4
        reason = rf"GPU 3: NVLink fabric UNHEALTHY: route unhealthy \(healthMask {mask:#x}\)"
        with pytest.raises(GpuError, match=reason):
            fabric_key(
                FakeGpu(infos=tray(g3={"health_summary": 2, "health_mask": mask})),
                Clock(),
                policy(),
                deadline=60,
                log=structlog.get_logger(),
            )

    def test_unhealthy_gpu_outside_the_clique_is_ignored(self) -> None:
        """Health counts only for GPUs that form the key (an all-zero UUID GPU is not one)."""
        infos = tray(g3={"health_summary": 2, "cluster_uuid": ZERO})
        assert fabric_key(FakeGpu(infos=infos), Clock(), policy(), deadline=60, log=structlog.get_logger())

    @pytest.mark.parametrize("summary", [3, 9], ids=["limited", "unknown-value"])
    def test_limited_capacity_warns_by_default(self, summary: int) -> None:
        """LIMITED_CAPACITY (or a summary value nvml.h does not define) passes with one warning by default."""
        with capture_logs() as logs:
            key = fabric_key(
                FakeGpu(infos=tray(g1={"health_summary": summary})),
                Clock(),
                policy(),
                deadline=60,
                log=structlog.get_logger(),
            )
        assert key is not None
        warning = [e for e in logs if e["log_level"] == "warning"]
        assert [e["event"] for e in warning] == ["gpu.fabric.degraded"]
        assert warning[0]["gpus"][0]["gpu"] == 1 and "fabric_limited = warn" in warning[0]["gpus"][0]["verdict"]

    def test_limited_capacity_refused_by_policy(self) -> None:
        """With fabric_limited = refuse, LIMITED_CAPACITY fails naming the setting."""
        with pytest.raises(GpuError, match=r"GPU 1: NVLink fabric LIMITED_CAPACITY .*fabric_limited = refuse"):
            fabric_key(
                FakeGpu(infos=tray(g1={"health_summary": 3})),
                Clock(),
                policy(fabric_limited="refuse"),
                deadline=60,
                log=structlog.get_logger(),
            )

    def test_v2_mask_problems_are_reported_not_judged(self) -> None:
        """Without a summary (v2), mask problems are logged as a warning and the key stands."""
        infos = tray(g0={"health_summary": None, "health_mask": OK_MASK & ~0x3 | 1, "layout": "v2"})
        with capture_logs() as logs:
            key = fabric_key(
                FakeGpu(infos=infos), Clock(), policy(fabric_limited="refuse"), deadline=60, log=structlog.get_logger()
            )
        assert key is not None
        degraded = [e for e in logs if e["event"] == "gpu.fabric.degraded"]
        assert degraded[0]["gpus"] == [
            {
                "gpu": 0,
                "health": "no health summary: NVLink bandwidth degraded",
                "verdict": "no health summary from this driver; mask not judged",
            }
        ]

    def test_healthy_summary_with_mask_problems_passes_with_a_warning(self) -> None:
        """A HEALTHY summary decides; problems in the mask beside it are logged."""
        infos = tray(g2={"health_mask": OK_MASK & ~(0x3 << 2) | 1 << 2})
        with capture_logs() as logs:
            assert fabric_key(FakeGpu(infos=infos), Clock(), policy(), deadline=60, log=structlog.get_logger())
        degraded = [e for e in logs if e["event"] == "gpu.fabric.degraded"]
        assert degraded[0]["gpus"] == [
            {"gpu": 2, "health": "HEALTHY: route recovery in progress", "verdict": "summary HEALTHY; mask not judged"}
        ]

    def test_no_fabric_checks_no_health(self) -> None:
        """A tray without fabric gives None and no warning, whatever its GPUs' health says."""
        infos: list[FabricInfo | None] = [fi(i, uuid=ZERO, health_summary=2) for i in range(2)]
        with capture_logs() as logs:
            assert fabric_key(FakeGpu(infos=infos), Clock(), policy(), deadline=60, log=structlog.get_logger()) is None
        assert [e["event"] for e in logs] == ["gpu.fabric.read"]


def test_nvml_gpu_without_driver_is_an_error_naming_the_binding() -> None:
    """On a host without libnvidia-ml, NvmlGpu raises GpuError naming nvidia-ml-py's version, never "no fabric"."""
    pytest.importorskip("pynvml")
    from importlib import metadata

    try:
        infos = NvmlGpu().fabric_infos()
    except GpuError as exc:
        assert "NVML init failed" in str(exc) and f"nvidia-ml-py {metadata.version('nvidia-ml-py')}" in str(exc)
        return
    pytest.skip(f"NVML initialises on this host ({len(infos)} GPUs): covered by tests/gpu")
