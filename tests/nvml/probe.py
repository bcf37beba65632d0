"""Child process for tests/gpu/test_nvml.py: imexctl's NVML code over the stand-in library.

Run with ``LD_LIBRARY_PATH`` naming the directory of the stand-in
``libnvidia-ml.so.1`` (glibc reads it at process start, hence a child) and
``PYTHONPATH`` naming the checkout.  Prints one JSON object on stdout.

    probe.py infos                 NvmlGpu().fabric_infos()
    probe.py key '{"fabric_wait_s": "3", "fabric_limited": "warn"}'
                                   fabric_key() with an instant clock
    probe.py call-v <version>      one raw nvmlDeviceGetGpuFabricInfoV call on GPU 0
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from imexctl.config import schema, settings
from imexctl.gpu import fabric as gpu
from imexctl.gpu import nvml
from imexctl.platform.errors import GpuError


class Clock:
    """Instant clock: sleeping only moves time."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, []  # type: float, List[float]

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


class Log:
    """Records events as [level, event, keys]."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append((level, event, kw))


def _info(info: Any) -> Any:
    if info is None:
        return None
    return {
        "index": info.gpu,
        "uuid": info.cluster_uuid.hex(),
        "clique": info.clique_id,
        "state": info.state,
        "status": info.status,
        "health_mask": info.health_mask,
        "health_summary": info.health_summary,
        "layout": info.layout,
        "health": info.health.text(),
    }


def _run(argv: list[str]) -> dict[str, Any]:
    if argv[0] == "infos":
        return {"infos": [_info(i) for i in gpu.NvmlGpu().fabric_infos()]}
    if argv[0] == "key":
        policy = json.loads(argv[1]) if len(argv) > 1 else {}
        cfg = settings.load(None, node="probe")
        cfg = cfg.replace(**{f"policy__{k}": schema.SCHEMA["policy"][k][1](v) for k, v in policy.items()})
        clock, log = Clock(), Log()
        try:
            out = {"key": gpu.fabric_key(gpu.NvmlGpu(), clock, cfg, deadline=float("inf"), log=log)}
        except GpuError as exc:
            out = _error(exc)
        return {**out, "slept": clock.slept, "events": log.events}
    if argv[0] == "call-v":
        return {"rc": _call_v(int(argv[1], 0))}
    raise SystemExit(f"probe.py: unknown mode {argv[0]!r}")


def _call_v(version: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        info = nvml.GpuFabricInfoV3(version=version)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")
        address = ctypes.cast(fn, ctypes.c_void_p).value
        assert address is not None
        call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(address)
        return int(call(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info)))
    finally:
        pynvml.nvmlShutdown()


def _error(exc: GpuError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__}


def main() -> None:
    try:
        out = _run(sys.argv[1:])
    except GpuError as exc:
        out = _error(exc)
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
