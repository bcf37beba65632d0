"""gpu: the clique rule of imex.md §10.3 and the NVML adapter (over a fake pynvml module)."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any, Callable, List, Optional

import pytest

from imexctl.errors import GpuError
from imexctl.gpu import FabricInfo, NvmlGpu, clique_key

UUID_A = bytes(range(1, 17))
UUID_B = b"\xbb" * 16
ZERO = bytes(16)
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3


def fi(index: int = 0, uuid: bytes = UUID_A, clique: int = 7, state: int = COMPLETED, status: int = 0) -> FabricInfo:
    return FabricInfo(index, uuid, clique, state, status)


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
            pytest.param([None, fi(1), fi(2, state=NOT_SUPPORTED)], "01020304-0506-0708-090a-0b0c0d0e0f10.7",
                         id="unsupported-skipped"),
            pytest.param([fi(0, uuid=ZERO), fi(1)], "01020304-0506-0708-090a-0b0c0d0e0f10.7", id="zero-skipped"),
            pytest.param([fi(0, clique=0)], "01020304-0506-0708-090a-0b0c0d0e0f10.0", id="clique-zero"),
        ],
    )
    def test_table(self, infos: List[Optional[FabricInfo]], key: Optional[str]) -> None:
        """GPUs without fabric support or with an all-zero cluster UUID do not form a clique."""
        assert clique_key(infos) == key

    @pytest.mark.parametrize("state", [NOT_STARTED, IN_PROGRESS, 7])
    def test_not_completed_is_an_error(self, state: int) -> None:
        """A GPU whose registration is not COMPLETED fails, naming the GPU and the state."""
        with pytest.raises(GpuError, match=f"GPU 2: NVLink fabric not attached \\(state {state}\\)"):
            clique_key([fi(0), fi(2, state=state)])

    def test_failed_registration_is_an_error(self) -> None:
        """A COMPLETED registration with a non-zero NVML status fails, naming the status."""
        with pytest.raises(GpuError, match=r"GPU 1: NVLink fabric registration error \(NVML status 999\)"):
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


# ---------------------------------------------------------------- NvmlGpu over a fake pynvml

try:
    import pynvml
except ImportError:  # pragma: no cover - a declared dependency
    pynvml = None

needs_pynvml = pytest.mark.skipif(pynvml is None, reason="nvidia-ml-py (pynvml) is not installed")


def _fill(ref: Any, info: FabricInfo) -> None:
    s = ref._obj  # the structure ctypes.byref() points to
    ctypes.memmove(ctypes.addressof(s) + type(s).clusterUuid.offset, info.cluster_uuid, 16)
    s.cliqueId, s.state, s.status = info.clique_id, info.state, info.status


def _error(code: int) -> Exception:
    return pynvml.NVMLError(code)  # type: ignore[no-any-return]


class FakeNvml(types.ModuleType):
    """A stand-in for the pynvml module: real structs and error classes, scripted answers."""

    def __init__(self, v: List[Callable[[Any], None]], legacy: Optional[List[Callable[[Any], None]]] = None,
                 init_error: Optional[Exception] = None) -> None:  # fmt: skip
        super().__init__("pynvml")
        for name in ("NVMLError", "NVMLError_NotSupported", "NVMLError_ArgumentVersionMismatch",
                     "NVMLError_FunctionNotFound", "c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_t"):  # fmt: skip
            setattr(self, name, getattr(pynvml, name))
        self.v, self.legacy, self.init_error = v, legacy or [], init_error
        self.log: List[str] = []

    def nvmlInit(self) -> None:
        self.log.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.log.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.v)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, ref: Any) -> int:
        assert type(ref._obj) is pynvml.c_nvmlGpuFabricInfo_v3_t and ref._obj.version == pynvml.nvmlGpuFabricInfo_v3
        self.v[handle](ref)
        return 0

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, ref: Any) -> int:
        assert type(ref._obj) is pynvml.c_nvmlGpuFabricInfo_t
        self.legacy[handle](ref)
        return 0


def answer(info: FabricInfo) -> Callable[[Any], None]:
    return lambda ref: _fill(ref, info)


def fail(code: int) -> Callable[[Any], None]:
    def raise_(ref: Any) -> None:
        raise _error(code)

    return raise_


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    def put(*args: Any, **kw: Any) -> FakeNvml:
        fake = FakeNvml(*args, **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return put


@needs_pynvml
class TestNvmlGpu:
    def test_reads_v3_struct_for_every_gpu(self, install: Callable[..., FakeNvml]) -> None:
        """Each GPU's v3 fabric info becomes a FabricInfo with the full 16-byte UUID."""
        uuid_with_nul = b"\x00\x01" + b"\xaa" * 14
        install([answer(fi(0, uuid=uuid_with_nul)), answer(fi(1, clique=9, state=IN_PROGRESS))])
        assert NvmlGpu().fabric_infos() == [fi(0, uuid=uuid_with_nul), fi(1, clique=9, state=IN_PROGRESS)]

    def test_not_supported_gpu_is_none(self, install: Callable[..., FakeNvml]) -> None:
        """A GPU without fabric support is reported as None."""
        install([fail(pynvml.NVML_ERROR_NOT_SUPPORTED), answer(fi(1))])
        assert NvmlGpu().fabric_infos() == [None, fi(1)]

    @pytest.mark.parametrize("code", ["NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "NVML_ERROR_FUNCTION_NOT_FOUND"])
    def test_old_driver_falls_back_to_legacy_call(self, install: Callable[..., FakeNvml], code: str) -> None:
        """An older driver without the v3 call is asked with the legacy struct."""
        install([fail(getattr(pynvml, code))], legacy=[answer(fi(0, clique=4))])
        assert NvmlGpu().fabric_infos() == [fi(0, clique=4)]

    def test_old_driver_not_supported_is_none(self, install: Callable[..., FakeNvml]) -> None:
        """NOT_SUPPORTED from the legacy call means no fabric, not a failed query."""
        install([fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)],
                legacy=[fail(pynvml.NVML_ERROR_NOT_SUPPORTED)])  # fmt: skip
        assert NvmlGpu().fabric_infos() == [None]

    def test_init_failure_is_a_gpu_error(self, install: Callable[..., FakeNvml]) -> None:
        """A driver that cannot be initialised raises GpuError, never an NVMLError."""
        install([], init_error=_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
        with pytest.raises(GpuError, match="NVML init failed"):
            NvmlGpu().fabric_infos()

    def test_query_failure_is_a_gpu_error_and_shuts_down(self, install: Callable[..., FakeNvml]) -> None:
        """A failing query raises GpuError with the cause chained, and NVML is shut down."""
        fake = install([fail(pynvml.NVML_ERROR_GPU_IS_LOST)])
        with pytest.raises(GpuError, match="NVML query failed") as info:
            NvmlGpu().fabric_infos()
        assert isinstance(info.value.__cause__, pynvml.NVMLError)
        assert fake.log == ["init", "shutdown"]


@needs_pynvml
def test_fabric_infos_feed_clique_key(install: Callable[..., FakeNvml]) -> None:
    """Four GPUs registered in one clique give that clique's key end to end."""
    install([answer(fi(i)) for i in range(4)])
    assert clique_key(NvmlGpu().fabric_infos()) == "01020304-0506-0708-090a-0b0c0d0e0f10.7"
