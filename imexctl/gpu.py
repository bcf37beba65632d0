"""NVLink fabric facts from NVML: does this tray belong to a multi-node NVLink clique?

``pynvml`` is imported only when a check runs, never at import time, so the
package (and its tests) work on hosts without the NVIDIA driver.  Rules follow
NVIDIA's DRA driver in strict mode (imex.md §10.3).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Protocol

from imexctl.errors import GpuError

__all__ = ["FabricInfo", "Gpu", "NvmlGpu", "clique_key"]

STATE_NOT_SUPPORTED = 0
STATE_COMPLETED = 3


@dataclasses.dataclass(frozen=True)
class FabricInfo:
    """One GPU's fabric registration."""

    index: int
    cluster_uuid: bytes
    clique_id: int
    state: int
    status: int


class Gpu(Protocol):
    """Source of the tray's GPU fabric facts."""

    def fabric_infos(self) -> List[Optional[FabricInfo]]:
        """One entry per GPU; None for a GPU without fabric support."""
        ...


def clique_key(infos: List[Optional[FabricInfo]]) -> Optional[str]:
    """``"<clusterUuid>.<cliqueId>"`` shared by all GPUs of the tray, or None without MNNVL.

    Raises:
        GpuError: a GPU's fabric is not registered (yet), failed, or GPUs disagree.
    """
    import uuid

    keys = set()
    for info in infos:
        if info is None or info.state == STATE_NOT_SUPPORTED:
            continue
        if info.state != STATE_COMPLETED:
            raise GpuError(f"GPU {info.index}: NVLink fabric not attached (state {info.state}); refusing IMEX")
        if info.status != 0:
            raise GpuError(f"GPU {info.index}: NVLink fabric registration error (NVML status {info.status})")
        if info.cluster_uuid == bytes(16):
            continue
        keys.add(f"{uuid.UUID(bytes=info.cluster_uuid)}.{info.clique_id}")
    if len(keys) > 1:
        raise GpuError(f"GPUs of this tray report several NVLink cliques: {', '.join(sorted(keys))}")
    return keys.pop() if keys else None


class NvmlGpu:
    """Reads fabric info through NVML (``nvidia-ml-py``)."""

    def fabric_infos(self) -> List[Optional[FabricInfo]]:
        """Query every GPU; NVML errors become :class:`GpuError`."""
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise GpuError("the nvidia-ml-py package (module pynvml) is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML init failed: {exc} (driver not loaded?)") from exc
        try:
            return [self._one(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML query failed: {exc}") from exc
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def _one(pynvml: Any, index: int) -> Optional[FabricInfo]:
        import ctypes

        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        # v3 struct when this nvidia-ml-py has it (13.x), else its V type (v2), else only the legacy call
        struct = getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None) or getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
        info = None
        if struct is not None and hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV"):
            info = struct()  # __init__ presets .version
            try:
                pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except pynvml.NVMLError_NotSupported:
                return None
            except (pynvml.NVMLError_ArgumentVersionMismatch, pynvml.NVMLError_FunctionNotFound):
                info = None
        if info is None:
            # older driver: the legacy call and struct, which may equally say "not supported"
            info = pynvml.c_nvmlGpuFabricInfo_t()
            try:
                pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
            except pynvml.NVMLError_NotSupported:
                return None
        return FabricInfo(index, bytes(info.clusterUuid), int(info.cliqueId), int(info.state), int(info.status))
