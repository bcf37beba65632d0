"""imexctl's NVML reader against a stand-in libnvidia-ml.so.1 loaded by the real pynvml.

The stand-in (tests/nvml/fake_nvml.c, see tests/nvml/README.md) is compiled once
per session with the system C compiler.  Each test runs imexctl in a child
process (tests/nvml/probe.py) whose ``LD_LIBRARY_PATH`` makes pynvml's
``CDLL("libnvidia-ml.so.1")`` find the stand-in.  tests/gpu/test_nvml_matrix.py runs
this module again under the oldest and the newest nvidia-ml-py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.support.ci import unavailable

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "nvml" / "fake_nvml.c"
PROBE = REPO / "tests" / "nvml" / "probe.py"
VARIANTS = {"full": [], "no_v": ["-DFAKE_NVML_NO_V"], "no_fabric_api": ["-DFAKE_NVML_NO_V", "-DFAKE_NVML_NO_LEGACY"]}
PYNVML_VERSION = metadata.version("nvidia-ml-py")

UUID_HEX = "00ff10203040506070809aabbccddee0"  # a NUL first and bytes > 0x7f: what 12.535's c_char array broke
KEY = f"{uuid.UUID(hex=UUID_HEX)}.7"
OTHER_UUID = "11" * 16

# driver behaviour -> (stand-in build, behaviour key, layout read, expected fabric calls for one GPU)
DRIVERS: dict[str, Any] = {
    "r580": ("full", "r580", "v3", ["nvmlDeviceGetGpuFabricInfoV version=0x3000028 -> 0"]),
    "r570": (
        "full",
        "r570",
        "v2",
        ["nvmlDeviceGetGpuFabricInfoV version=0x3000028 -> 25", "nvmlDeviceGetGpuFabricInfoV version=0x2000024 -> 0"],
    ),
    "legacy-only": (
        "full",
        "legacy-only",
        "legacy",
        [
            "nvmlDeviceGetGpuFabricInfoV version=0x3000028 -> 25",
            "nvmlDeviceGetGpuFabricInfoV version=0x2000024 -> 25",
            "nvmlDeviceGetGpuFabricInfo -> 0",
        ],
    ),
    "no-v-call": ("no_v", "r580", "legacy", ["nvmlDeviceGetGpuFabricInfo -> 0"]),
}
DRIVER_VERSIONS = {"r580": "580.65.06", "r570": "570.133.20", "legacy-only": "550.90.07", "no-v-call": "535.183.01"}
HEALTHY = 0x2 | 0x2 << 2 | 0x2 << 4 | 0x2 << 6 | 0x1 << 8 | 0x1 << 12 | 0x1 << 14  # every field "no problem"


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stand-in compiled in each variant: variant -> directory holding libnvidia-ml.so.1."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        unavailable("no C compiler (cc) on PATH to build the NVML stand-in; 'bash .ci/setup test' installs gcc")
    out = {}
    for name, flags in VARIANTS.items():
        folder = tmp_path_factory.mktemp(f"nvml-{name}")
        argv = [
            cc,
            "-shared",
            "-fPIC",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            *flags,
            "-o",
            str(folder / "libnvidia-ml.so.1"),
            str(SOURCE),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}\n{done.stderr}"
        out[name] = folder
    return out


@dataclasses.dataclass
class Run:
    out: dict[str, Any]
    calls: list[str]
    stderr: str

    @property
    def fabric_calls(self) -> list[str]:
        """Fabric calls of GPU 0, without the ``gpu=0`` part."""
        return [c.replace(" gpu=0", "") for c in self.calls if "FabricInfo" in c and " gpu=0" in c]


@pytest.fixture
def nvml(fake_nvml: dict[str, Path], tmp_path: Path) -> Iterator[Any]:
    """Run probe.py over the stand-in: nvml(config, mode, *args, variant=...) -> Run."""
    counter = iter(range(1000))

    def run(
        config: dict[str, Any], mode: str = "infos", *args: str, variant: str = "full", stderr_ok: bool = False
    ) -> Run:
        n = next(counter)
        cfg, log = tmp_path / f"nvml{n}.conf", tmp_path / f"nvml{n}.log"
        cfg.write_text("".join(f"{k} = {v}\n" for k, v in config.items()))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "LD_LIBRARY_PATH": str(fake_nvml[variant]),
            "FAKE_NVML_CONFIG": str(cfg),
            "FAKE_NVML_LOG": str(log),
        }
        done = subprocess.run(
            [sys.executable, str(PROBE), mode, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        if not stderr_ok:
            assert done.stderr == "", done.stderr
        calls = log.read_text().splitlines() if log.exists() else []
        return Run(json.loads(done.stdout), calls, done.stderr)

    yield run


def tray(driver: str = "r580", *, count: int = 4, every: dict[str, Any] | None = None, **gpus: Any) -> dict[str, Any]:
    """A stand-in config: ``count`` GPUs COMPLETED in clique 7 of UUID_HEX, healthy.

    ``every`` overrides fields on every GPU, ``gpu<i>={...}`` on one.
    """
    config: dict[str, Any] = {
        "behaviour": DRIVERS[driver][1],
        "driver_version": DRIVER_VERSIONS[driver],
        "count": count,
    }
    for i in range(count):
        fields = {"state": 3, "status": 0, "clique": 7, "uuid": UUID_HEX, "health_mask": HEALTHY, "health_summary": 1}
        fields.update(every or {})
        fields.update(gpus.get(f"gpu{i}", {}))
        config.update({f"gpu.{i}.{k}": v for k, v in fields.items()})
    return config


def key_of(run: Any, driver: str, config: dict[str, Any], **policy: str) -> Run:
    return run(config, "key", json.dumps(policy), variant=DRIVERS[driver][0])  # type: ignore[no-any-return]


def versions_named(message: str, driver: str) -> bool:
    return f"nvidia-ml-py {PYNVML_VERSION}" in message and f"driver {DRIVER_VERSIONS[driver]}" in message


@pytest.mark.parametrize("driver", list(DRIVERS))
class TestEveryDriver:
    def test_one_clique_gives_its_key(self, nvml: Any, driver: str) -> None:
        """A 4-GPU tray in one clique gives "<uuid>.<clique>", NUL and high bytes of the UUID intact."""
        done = key_of(nvml, driver, tray(driver))
        assert done.out == {"key": KEY, "slept": [], "events": done.out["events"]}
        assert [e[1] for e in done.out["events"]] == ["gpu.fabric.read"]

    def test_calls_fall_back_in_order(self, nvml: Any, driver: str) -> None:
        """The versioned call is tried with v3, then v2, then the legacy call; the accepted layout is reported."""
        done = nvml(tray(driver, count=1), variant=DRIVERS[driver][0])
        assert done.fabric_calls == DRIVERS[driver][3]
        assert [i["layout"] for i in done.out["infos"]] == [DRIVERS[driver][2]]

    def test_init_and_shutdown_pair(self, nvml: Any, driver: str) -> None:
        """NVML is initialised once and shut down once per query."""
        done = nvml(tray(driver), variant=DRIVERS[driver][0])
        assert done.calls[0] == "nvmlInitWithFlags flags=0 -> 0" and done.calls[-1] == "nvmlShutdown -> 0"
        assert sum(c.startswith("nvmlInit") for c in done.calls) == 1

    def test_fields_read_exactly(self, nvml: Any, driver: str) -> None:
        """Every field arrives as the stand-in wrote it, health fields only where the layout has them."""
        config = tray(driver, count=2, gpu1={"clique": 4000000000, "status": 0, "health_mask": 0x1 | HEALTHY & ~0x3})
        infos = nvml(config, variant=DRIVERS[driver][0]).out["infos"]
        layout = DRIVERS[driver][2]
        assert infos[1]["uuid"] == UUID_HEX and infos[1]["clique"] == 4000000000 and infos[1]["state"] == 3
        assert infos[1]["health_mask"] == (None if layout == "legacy" else 0x1 | HEALTHY & ~0x3)
        assert infos[1]["health_summary"] == (1 if layout == "v3" else None)

    def test_mixed_cliques_are_an_error(self, nvml: Any, driver: str) -> None:
        """GPUs of one tray in two cliques fail the check, naming both keys."""
        done = key_of(nvml, driver, tray(driver, gpu3={"uuid": OTHER_UUID}))
        assert done.out["error"] == "GpuError"
        assert KEY in done.out["message"] and f"{uuid.UUID(hex=OTHER_UUID)}.7" in done.out["message"]

    def test_not_supported_is_no_fabric(self, nvml: Any, driver: str) -> None:
        """NOT_SUPPORTED from the fabric call means no fabric on that GPU: no key, no error."""
        config = tray(driver, every={"error": 3})
        assert key_of(nvml, driver, config).out["key"] is None
        assert nvml(config, variant=DRIVERS[driver][0]).out["infos"] == [None] * 4

    def test_all_zero_uuid_is_no_fabric(self, nvml: Any, driver: str) -> None:
        """COMPLETED with an all-zero cluster UUID is not multi-node NVLink: no key."""
        config = tray(driver, every={"uuid": "00" * 16})
        assert key_of(nvml, driver, config).out["key"] is None

    def test_failed_registration_with_a_zero_identity_is_an_error(self, nvml: Any, driver: str) -> None:
        """COMPLETED, status INSUFFICIENT_RESOURCES, all-zero UUID and clique 0 (Azure/azhpc-images PR #506): an
        error naming the status on every layout, never 'no fabric'; the fields arrive as the driver wrote them."""
        config = tray(driver, every={"status": 23, "uuid": "00" * 16, "clique": 0})
        infos = nvml(config, variant=DRIVERS[driver][0]).out["infos"]
        assert {(i["state"], i["status"], i["uuid"], i["clique"]) for i in infos} == {(3, 23, "00" * 16, 0)}
        done = key_of(nvml, driver, config)
        assert done.out["error"] == "GpuError" and "key" not in done.out, done.out
        assert "GPU 0: NVLink fabric registration error (NVML_ERROR_INSUFFICIENT_RESOURCES (23))" in done.out["message"]

    def test_unhealthy_summary(self, nvml: Any, driver: str) -> None:
        """v3 UNHEALTHY fails with the decoded reason; without a summary the mask is reported, not judged."""
        bad_mask = HEALTHY & ~(0x3 << 4) | 0x1 << 4  # ROUTE_UNHEALTHY = TRUE
        done = key_of(nvml, driver, tray(driver, gpu2={"health_summary": 2, "health_mask": bad_mask}))
        layout = DRIVERS[driver][2]
        if layout == "v3":
            assert done.out["error"] == "GpuError"
            assert "GPU 2: NVLink fabric UNHEALTHY: route unhealthy" in done.out["message"]
        elif layout == "v2":
            assert done.out["key"] == KEY
            degraded = [e for e in done.out["events"] if e[1] == "gpu.fabric.degraded"]
            assert degraded[0][0] == "warning" and "route unhealthy" in degraded[0][2]["gpus"][0]["health"]
        else:
            assert done.out["key"] == KEY and [e[1] for e in done.out["events"]] == ["gpu.fabric.read"]

    def test_nvml_error_names_both_versions(self, nvml: Any, driver: str) -> None:
        """An error code from the fabric call is a GpuError naming GPU, call, code, nvidia-ml-py and driver."""
        done = key_of(nvml, driver, tray(driver, gpu2={"error": 15}))
        assert done.out["error"] == "GpuError", done.out
        message = done.out["message"]
        assert "GPU 2: nvmlDeviceGetGpuFabricInfo" in message and "NVML_ERROR_GPU_IS_LOST (15)" in message
        assert versions_named(message, driver), message


class TestNvmlErrors:
    def test_init_failure(self, nvml: Any) -> None:
        """An NVML that does not initialise is a GpuError naming nvidia-ml-py, never "no fabric"."""
        done = nvml({**tray(), "init_error": 9})
        assert done.out["error"] == "GpuError" and "NVML init failed" in done.out["message"]
        message = done.out["message"]
        assert f"nvidia-ml-py {PYNVML_VERSION}" in message and "driver version unknown" in message
        assert "NVML_ERROR_DRIVER_NOT_LOADED (9)" in done.out["message"]

    def test_count_failure(self, nvml: Any) -> None:
        """A failing device count is a GpuError with both versions, and NVML is still shut down."""
        done = nvml({**tray(), "count_error": 999})
        assert done.out["error"] == "GpuError" and versions_named(done.out["message"], "r580")
        assert done.calls[-1] == "nvmlShutdown -> 0"

    def test_handle_failure(self, nvml: Any) -> None:
        """A GPU whose handle cannot be had is a GpuError, not a GPU without fabric."""
        done = nvml(tray(gpu1={"handle_error": 15}))
        assert done.out["error"] == "GpuError" and "GPU_IS_LOST" in done.out["message"]

    def test_driver_version_unknown_is_said(self, nvml: Any) -> None:
        """When the driver version query fails, errors say why the version is unknown."""
        done = nvml({**tray(), "driver_version_error": 2, "gpu.0.error": 15})
        assert "driver unknown (NVMLError" in done.out["message"] and "GPU 0" in done.out["message"]

    def test_driver_version_failure_alone_is_harmless(self, nvml: Any) -> None:
        """A driver version that cannot be read does not fail a good read."""
        assert len(nvml({**tray(), "driver_version_error": 2}).out["infos"]) == 4

    def test_no_fabric_call_at_all_is_an_error(self, nvml: Any) -> None:
        """A library with neither fabric call is an error (too old a driver), not "no fabric"."""
        done = nvml(tray(), variant="no_fabric_api")
        assert done.out["error"] == "GpuError" and "FUNCTION_NOT_FOUND" in done.out["message"]

    def test_no_gpus_is_no_fabric(self, nvml: Any) -> None:
        """NVML that answers with zero GPUs gives no key."""
        assert nvml(tray(count=0), "key").out["key"] is None


class TestPolicyOverRealCalls:
    def test_pending_registration_is_waited_for(self, nvml: Any) -> None:
        """A GPU NOT_STARTED, then IN_PROGRESS, then COMPLETED is asked again each second until done."""
        done = nvml(tray(gpu1={"state": "1,2,3"}), "key")
        assert done.out["key"] == KEY and done.out["slept"] == [1.0, 1.0]
        waiting = [e for e in done.out["events"] if e[1] == "gpu.fabric.waiting"]
        assert len(waiting) == 1 and waiting[0][2]["gpus"] == {"1": "NOT_STARTED"}
        assert sum(c.startswith("nvmlInit") for c in done.calls) == 3

    def test_registration_pending_past_the_wait_fails(self, nvml: Any) -> None:
        """A registration still IN_PROGRESS after fabric_wait_s fails, naming GPU and state."""
        done = nvml(tray(gpu3={"state": 2}), "key", json.dumps({"fabric_wait_s": "2.5"}))
        assert done.out["error"] == "GpuError" and done.out["slept"] == [1.0, 1.0, 0.5]
        assert "GPU 3: NVLink fabric not attached: registration still IN_PROGRESS after 2.5 s" in done.out["message"]

    @pytest.mark.parametrize("limited", ["warn", "refuse"])
    def test_limited_capacity_by_policy(self, nvml: Any, limited: str) -> None:
        """LIMITED_CAPACITY warns (default) or refuses, with the decoded mask."""
        mask = HEALTHY & ~0x3 | 0x1  # DEGRADED_BW = TRUE
        config = tray(gpu0={"health_summary": 3, "health_mask": mask})
        done = nvml(config, "key", json.dumps({"fabric_limited": limited}))
        if limited == "warn":
            assert done.out["key"] == KEY
            degraded = [e for e in done.out["events"] if e[1] == "gpu.fabric.degraded"]
            assert degraded[0][2]["gpus"][0]["health"] == "LIMITED_CAPACITY: NVLink bandwidth degraded"
        else:
            assert "GPU 0: NVLink fabric LIMITED_CAPACITY: NVLink bandwidth degraded" in done.out["message"]

    def test_incorrect_configuration_is_decoded(self, nvml: Any) -> None:
        """An UNHEALTHY GPU with INCORRECT_CONFIGURATION = INSUFFICIENT_NVLINKS says so."""
        mask = HEALTHY & ~(0xF << 8) | 5 << 8
        done = nvml(tray(gpu0={"health_summary": 2, "health_mask": mask}), "key")
        assert "incorrect configuration: insufficient NVLinks" in done.out["message"]
        assert f"healthMask {mask:#x}" in done.out["message"]

    def test_registration_error_status(self, nvml: Any) -> None:
        """COMPLETED with a non-success status is a registration error naming the status."""
        done = nvml(tray(gpu1={"status": 999}), "key")
        assert "GPU 1: NVLink fabric registration error (NVML_ERROR_UNKNOWN (999))" in done.out["message"]


class TestStandIn:
    def test_refuses_an_unknown_struct_version(self, nvml: Any) -> None:
        """The stand-in answers a version it does not know with ARGUMENT_VERSION_MISMATCH and a stderr line."""
        done = nvml(tray(), "call-v", "0x01000010", stderr_ok=True)
        assert done.out["rc"] == 25 and "unknown struct version 0x1000010" in done.stderr

    def test_refuses_an_unknown_config_key(self, nvml: Any) -> None:
        """A config key the stand-in does not know fails init with a stderr line."""
        done = nvml({**tray(), "gpu.0.colour": "blue"}, stderr_ok=True)
        assert done.out["error"] == "GpuError" and "unknown key or bad value: gpu.0.colour" in done.stderr

    def test_refuses_a_gpu_beyond_count(self, nvml: Any) -> None:
        """A GPU configured beyond ``count`` is a config error, not silently ignored."""
        done = nvml({**tray(count=2), "gpu.5.state": 3}, stderr_ok=True)
        assert done.out["error"] == "GpuError" and "gpu.5 is configured but count = 2" in done.stderr
