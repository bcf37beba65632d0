"""NvmlGpu against the real driver: runs only where NVML initialises (``-m gpu``).

What the stand-in NVML (tests/gpu/test_nvml.py) cannot prove: that a real driver
accepts our struct pointers, which layout it takes, and that what we read is
what ``nvidia-smi`` shows (docs/nvml.md, "Confirming on hardware").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl.gpu import nvml
from imexctl.gpu.fabric import FabricInfo, NvmlGpu, clique_key
from imexctl.platform.errors import GpuError

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent.parent


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError: no driver here
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture(scope="module")
def gpu_count() -> Iterator[int]:
    """The number of GPUs NVML sees; skips the module where NVML does not initialise."""
    if not _nvml_works():
        pytest.skip("NVML does not initialise here (no NVIDIA driver)")
    import pynvml

    pynvml.nvmlInit()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    yield count


def test_fabric_infos_one_entry_per_gpu(gpu_count: int) -> None:
    """NvmlGpu returns one entry per GPU, each None or a well-formed FabricInfo read with a known layout."""
    infos = NvmlGpu().fabric_infos()
    assert len(infos) == gpu_count
    for index, info in enumerate(infos):
        if info is None:
            continue
        assert isinstance(info, FabricInfo) and info.gpu == index
        assert isinstance(info.cluster_uuid, bytes) and len(info.cluster_uuid) == 16
        assert info.state in nvml.STATE_NAMES and info.clique_id >= 0
        assert info.layout in ("v3", "v2", "legacy")
        assert (info.health_mask is None) == (info.layout == "legacy")
        assert (info.health_summary is None) == (info.layout != "v3")
        info.health.text()  # decodes whatever the driver reports


def test_fabric_infos_twice_agree(gpu_count: int) -> None:
    """Two queries in a row (init/shutdown each) give the same answer."""
    assert NvmlGpu().fabric_infos() == NvmlGpu().fabric_infos()


def test_versions_are_known_after_a_read(gpu_count: int) -> None:
    """After a read, NvmlGpu knows the nvidia-ml-py and driver versions it names in errors."""
    gpu = NvmlGpu()
    gpu.fabric_infos()
    assert gpu.versions is not None and re.match(r"\d+\.\d+", gpu.versions.driver), gpu.versions


def test_clique_key_on_real_hardware(gpu_count: int) -> None:
    """clique_key gives None, a 'uuid.cliqueId' key, or a GpuError naming a GPU; nothing else."""
    infos = NvmlGpu().fabric_infos()
    try:
        key = clique_key(infos)
    except GpuError as exc:
        assert re.match(r"GPU \d+: |GPUs of this tray report several", str(exc)), exc
        return
    if key is not None:
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d+", key)
        assert any(i is not None and i.cluster_uuid != bytes(16) for i in infos)


def _smi_fabric(gpu_count: int) -> list[tuple[str, int] | None]:
    """(ClusterUUID, CliqueId) per GPU section of ``nvidia-smi -q``; None where it prints N/A or nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=120, check=True).stdout
    sections = re.split(
        r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*$", out, flags=re.MULTILINE
    )[1:]
    if len(sections) != gpu_count:
        pytest.skip(f"nvidia-smi -q shows {len(sections)} GPU sections, NVML {gpu_count} GPUs")
    found: list[tuple[str, int] | None] = []
    for text in sections:
        cluster = re.search(r"ClusterUUID\s*:\s*(\S+)", text)
        clique = re.search(r"CliqueId\s*:\s*(\d+)", text)
        ok = cluster is not None and clique is not None and cluster.group(1).upper() != "N/A"
        found.append((cluster.group(1).lower(), int(clique.group(1))) if ok else None)  # type: ignore[union-attr]
    if not any(found):
        pytest.skip("nvidia-smi -q shows no ClusterUUID/CliqueId on this host")
    return found


def test_same_fabric_as_nvidia_smi(gpu_count: int) -> None:
    """Where nvidia-smi -q shows a GPU's ClusterUUID and CliqueId, imexctl reads the same."""
    expected = _smi_fabric(gpu_count)
    infos = NvmlGpu().fabric_infos()
    for index, (info, smi) in enumerate(zip(infos, expected)):
        if smi is None:
            continue
        assert info is not None, f"GPU {index}: nvidia-smi shows {smi}, NVML says not supported"
        assert (str(uuid.UUID(bytes=info.cluster_uuid)), info.clique_id) == smi, f"GPU {index}"


def test_topology_json_reports_what_the_reader_reads(gpu_count: int) -> None:
    """'imexctl topology --json' in its own process: one line, every GPU, the key clique_key gives (docs/topology.md)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "imexctl", "topology", "--json", "--node", "gpu-test"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.count("\n") == 1 and done.stderr == "", done.stdout + done.stderr
    doc = json.loads(done.stdout)
    data = doc["data"]
    assert doc["exit_code"] == done.returncode and data["node"] == "gpu-test" and len(data["gpus"]) == gpu_count
    infos = NvmlGpu().fabric_infos()
    try:
        key = clique_key(infos)
    except GpuError:
        assert (done.returncode, data["fabric"], data["key"]) == (69, "error", None)
        return
    assert done.returncode == 0 and data["key"] == key and data["fabric"] == ("nvlink" if key else "none")
    for info, gpu in zip(infos, data["gpus"]):
        if info is not None:
            assert (gpu["cluster_uuid"], gpu["clique_id"], gpu["layout"]) == (
                str(uuid.UUID(bytes=info.cluster_uuid)),
                info.clique_id,
                info.layout,
            )
    assert re.match(r"\d+\.\d+", data["nvml"]["driver"]), data["nvml"]
