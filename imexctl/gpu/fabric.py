"""NVLink fabric facts from NVML: does this tray belong to a multi-node NVLink clique?

``pynvml`` is imported only when a check runs, never at import time, so the
package (and its tests) work on hosts without the NVIDIA driver.  pynvml only
loads ``libnvidia-ml.so.1`` and hands out handles; the fabric structs and calls
are imexctl's own (:mod:`imexctl.gpu.nvml`).  Clique rules follow NVIDIA's DRA
driver in strict mode (design.md source nvml-clique); the waiting and health policy is ours
(docs/nvml.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from imexctl.gpu import nvml
from imexctl.platform import Record
from imexctl.platform.errors import GpuError

if TYPE_CHECKING:
    from imexctl.config.settings import Settings

__all__ = ["FABRIC_POLL_S", "Clock", "FabricInfo", "Gpu", "NvmlGpu", "clique_key", "fabric_key"]

STATE_NOT_SUPPORTED = nvml.STATE_NOT_SUPPORTED
STATE_COMPLETED = nvml.STATE_COMPLETED
_PENDING = (nvml.STATE_NOT_STARTED, nvml.STATE_IN_PROGRESS)
FABRIC_POLL_S = 1.0  # pause between NVML queries while a GPU's fabric registration is pending


class FabricInfo(Record):
    """One GPU's fabric registration, as NVML reported it.

    ``health_mask`` is None for the legacy struct, ``health_summary`` None for
    legacy and v2; ``layout`` names the struct the driver accepted.
    """

    #: the GPU's NVML index
    gpu: int
    cluster_uuid: bytes
    clique_id: int
    state: int
    status: int
    health_mask: int | None = None
    health_summary: int | None = None
    layout: str = ""

    @property
    def health(self) -> nvml.FabricHealth:
        """The decoded health mask and summary."""
        return nvml.decode_health(self.health_mask, self.health_summary)

    @property
    def state_name(self) -> str:
        """``COMPLETED``, ``IN_PROGRESS``, ... or ``UNKNOWN(n)``."""
        return nvml.STATE_NAMES.get(self.state, f"UNKNOWN({self.state})")

    def describe(self) -> dict[str, object]:
        """Plain data for logs and ``--json`` output (UUID as canonical text)."""
        import uuid

        return {
            "gpu": self.gpu,
            "state": self.state_name,
            "status": nvml.return_name(self.status),
            "cluster_uuid": str(uuid.UUID(bytes=self.cluster_uuid)),
            "clique_id": self.clique_id,
            "layout": self.layout,
            "health": self.health.text(),
        }


class Gpu(Protocol):
    """Source of the tray's GPU fabric facts."""

    def fabric_infos(self) -> list[FabricInfo | None]:
        """One entry per GPU; None for a GPU without fabric support."""
        ...


class Clock(Protocol):
    """The part of :class:`imexctl.platform.host.Host` a fabric wait needs."""

    def monotonic(self) -> float:
        """Monotonic clock, seconds."""

    def sleep(self, seconds: float) -> None:
        """Sleep."""


# ---------------------------------------------------------------- policy (pure over FabricInfo)


def clique_key(infos: list[FabricInfo | None]) -> str | None:
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
            raise GpuError(f"GPU {info.gpu}: NVLink fabric not attached (state {info.state_name}); refusing IMEX")
        # the status before the UUID: a failed registration reads COMPLETED with an all-zero UUID and clique 0,
        # a fault of the tray and never "no fabric" (design.md source nvml-failed-registration)
        if info.status != nvml.SUCCESS:
            raise GpuError(f"GPU {info.gpu}: NVLink fabric registration error ({nvml.return_name(info.status)})")
        if info.cluster_uuid == bytes(16):
            continue
        keys.add(f"{uuid.UUID(bytes=info.cluster_uuid)}.{info.clique_id}")
    if len(keys) > 1:
        raise GpuError(f"GPUs of this tray report several NVLink cliques: {', '.join(sorted(keys))}")
    return keys.pop() if keys else None


def fabric_key(gpu: Gpu, clock: Clock, settings: Settings, *, deadline: float, log: Any) -> str | None:
    """This tray's clique key after waiting for pending registrations and checking health.

    A GPU whose registration is ``NOT_STARTED`` or ``IN_PROGRESS`` is asked again
    every :data:`FABRIC_POLL_S` until ``[policy] fabric_wait_s`` or ``deadline``
    (``clock.monotonic()`` time) ends.  Health is judged on the GPUs that form
    the key: ``UNHEALTHY`` fails; ``LIMITED_CAPACITY`` fails or warns per
    ``[policy] fabric_limited``.

    Returns:
        The key, or None when this tray has no multi-node NVLink fabric.

    Raises:
        GpuError: NVML failed, registration still pending at the end of the wait,
            a registration error, several cliques, or a health verdict.
    """
    start = clock.monotonic()
    until = min(start + float(settings.policy.fabric_wait_s), deadline)
    infos = _wait_registered(gpu, clock, start, until, log)
    key = clique_key(infos)
    members = [i for i in infos if i is not None and i.state == STATE_COMPLETED and i.cluster_uuid != bytes(16)]
    if key is not None:
        _judge_health(members, settings.policy.fabric_limited, log)
    log.debug(
        "gpu.fabric.read",
        key=key,
        waited_s=round(clock.monotonic() - start, 3),
        gpus=[i.describe() for i in infos if i is not None],
    )
    return key


def _wait_registered(gpu: Gpu, clock: Clock, start: float, until: float, log: Any) -> list[FabricInfo | None]:
    announced = False
    while True:
        infos = gpu.fabric_infos()
        pending = [i for i in infos if i is not None and i.state in _PENDING]
        if not pending:
            return infos
        now = clock.monotonic()
        if now >= until:
            first = pending[0]
            raise GpuError(
                f"GPU {first.gpu}: NVLink fabric not attached: registration still {first.state_name} "
                f"after {now - start:.1f} s ({len(pending)} GPU(s) pending; the wait ends at [policy] "
                f"fabric_wait_s or the readiness deadline); refusing IMEX"
            )
        if not announced:
            log.info("gpu.fabric.waiting", gpus={i.gpu: i.state_name for i in pending}, wait_s=round(until - now, 3))
            announced = True
        clock.sleep(min(FABRIC_POLL_S, until - now))


def _judge_health(members: list[FabricInfo], limited: str, log: Any) -> None:
    degraded: list[tuple[FabricInfo, str]] = []
    for info in members:
        health = info.health
        if info.health_summary == nvml.SUMMARY_UNHEALTHY:
            raise GpuError(f"GPU {info.gpu}: NVLink fabric {health.text()} ({_mask(info)}); refusing IMEX")
        if info.health_summary is None or info.health_summary in (nvml.SUMMARY_HEALTHY, nvml.SUMMARY_NOT_SUPPORTED):
            if health.problems:  # NVIDIA does not say how to weigh the mask: the summary (if any) decides
                why = f"summary {health.summary}" if health.summary else "no health summary from this driver"
                degraded.append((info, f"{why}; mask not judged"))
            continue
        if limited == "refuse":  # LIMITED_CAPACITY, or a summary value this header does not define
            raise GpuError(
                f"GPU {info.gpu}: NVLink fabric {health.text()} ({_mask(info)}); "
                f"refusing IMEX ([policy] fabric_limited = refuse)"
            )
        degraded.append((info, "allowed by [policy] fabric_limited = warn"))
    if degraded:
        log.warning(
            "gpu.fabric.degraded",
            gpus=[{"gpu": i.gpu, "health": i.health.text(), "verdict": why} for i, why in degraded],
        )


def _mask(info: FabricInfo) -> str:
    return "no healthMask" if info.health_mask is None else f"healthMask {info.health_mask:#x}"


# ---------------------------------------------------------------- NVML through pynvml


class NvmlVersions(Record):
    """What an NVML error message names: the Python binding and the driver."""

    python: str
    driver: str

    def text(self) -> str:
        return f"nvidia-ml-py {self.python}, driver {self.driver}"


class NvmlGpu:
    """Reads fabric info through the ``libnvidia-ml.so.1`` that nvidia-ml-py loads.

    Every failure of the NVML layer becomes :class:`GpuError` naming the
    nvidia-ml-py and driver versions; a failed read is never "no fabric".
    """

    def __init__(self) -> None:
        self.versions: NvmlVersions | None = None

    def fabric_infos(self) -> list[FabricInfo | None]:
        """Query every GPU (init, read, shutdown)."""
        pynvml = _import_pynvml()
        python = _package_version()
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            raise GpuError(
                f"NVML init failed: {_describe(exc)} (driver not loaded?) "
                f"[nvidia-ml-py {python}, driver version unknown]"
            ) from exc
        self.versions = NvmlVersions(python, "unknown")
        try:
            self.versions = NvmlVersions(python, _driver_version(pynvml))
            infos = _read_all(pynvml)
        except Exception as exc:
            _shutdown_quietly(pynvml)
            raise GpuError(f"NVML fabric query failed: {_describe(exc)} [{self.versions.text()}]") from exc
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            raise GpuError(f"NVML shutdown failed: {_describe(exc)} [{self.versions.text()}]") from exc
        return infos


def _import_pynvml() -> Any:
    try:
        import pynvml
    except Exception as exc:
        raise GpuError(f"cannot import nvidia-ml-py (module pynvml): {_describe(exc)}") from exc
    return pynvml


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except Exception:  # not installed as a distribution (a vendored pynvml.py)
        return "unknown"


def _driver_version(pynvml: Any) -> str:
    """NvmlSystemGetDriverVersion when it answers, else ``unknown (<why>)``."""
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:
        return f"unknown ({_describe(exc)})"
    return version.decode(errors="replace") if isinstance(version, bytes) else str(version)


def _read_all(pynvml: Any) -> list[FabricInfo | None]:
    lookup = _lookup(pynvml)
    out: list[FabricInfo | None] = []
    for index in range(int(pynvml.nvmlDeviceGetCount())):
        raw = nvml.read_fabric(lookup, pynvml.nvmlDeviceGetHandleByIndex(index), index)
        out.append(
            None
            if raw is None
            else FabricInfo(
                index,
                raw.cluster_uuid,
                raw.clique_id,
                raw.state,
                raw.status,
                raw.health_mask,
                raw.health_summary,
                raw.layout,
            )
        )
    return out


def _lookup(pynvml: Any) -> nvml.Lookup:
    """Symbol addresses from pynvml's loaded library (``_nvmlGetFunctionPointer``, in every release we allow)."""
    import ctypes

    get = getattr(pynvml, "_nvmlGetFunctionPointer", None)
    if get is None:
        raise GpuError("this nvidia-ml-py has no _nvmlGetFunctionPointer")

    def lookup(name: str) -> int | None:
        try:
            fn = get(name)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.ERROR_FUNCTION_NOT_FOUND:
                return None
            raise
        # our own prototype over the address: never change argtypes on pynvml's shared function object
        return ctypes.cast(fn, ctypes.c_void_p).value

    return lookup


def _shutdown_quietly(pynvml: Any) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:  # noqa: S110 # the error being raised already says what went wrong
        pass


def _describe(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost: GPU is lost (NVML_ERROR_GPU_IS_LOST (15))`` and the like; never raises."""
    try:
        text = str(exc)
    except Exception:
        text = "?"
    code = getattr(exc, "value", None)
    suffix = f" ({nvml.return_name(code)})" if isinstance(code, int) and not isinstance(exc, nvml.NvmlCallError) else ""
    return f"{type(exc).__name__}: {text}{suffix}"
