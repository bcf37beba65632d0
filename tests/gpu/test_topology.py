"""topology: ``imexctl topology`` (the tray's NVLink key and health), its JSON, and the key in ``imexctl status``.

In-process over FakeGpu, then in a child process over the stand-in NVML
(tests/nvml, the fixtures of tests/gpu/test_nvml.py) and with no NVML at all.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.gpu import nvml
from imexctl.gpu.fabric import FabricInfo
from imexctl.gpu.topology import parse_key, read_tray, render_text
from imexctl.platform.errors import GpuError
from tests.gpu import test_nvml
from tests.gpu.test_nvml import HEALTHY, KEY, UUID_HEX, tray
from tests.support.fakes import FakeGpu, FakeHost, job_env

REPO = Path(__file__).resolve().parents[2]
fake_nvml = test_nvml.fake_nvml  # the stand-in libnvidia-ml.so.1, compiled once per session
FAKE_KEY = "11111111-1111-1111-1111-111111111111.7"  # FakeGpu's default tray
DATA_KEYS = {"node", "fabric", "key", "reason", "error", "health", "gpus", "nvml"}
GPU_KEYS = {
    "gpu",
    "state",
    "status",
    "cluster_uuid",
    "clique_id",
    "layout",
    "health",
    "health_summary",
    "health_problems",
    "health_mask",
}


def info(index: int, *, state: int = 3, uuid_bytes: bytes = b"\x11" * 16, **kw: Any) -> FabricInfo:
    return FabricInfo(index, uuid_bytes, kw.pop("clique", 7), state, 0, **kw)


class TestParseKey:
    def test_canonical_form(self) -> None:
        """A key in any letter case becomes the lower-case canonical form; the clique id loses leading zeros."""
        assert parse_key("4F2A9C1E-5D6B-4E8F-9A0B-1C2D3E4F5A6B.007") == "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.7"

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param("4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b", "is not <clusterUuid>.<cliqueId>", id="no-dot"),
            pytest.param("4f2a9c1e5d6b4e8f9a0b1c2d3e4f5a6b.7", "is not a cluster UUID", id="no-hyphens"),
            pytest.param("{4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b}.7", "is not a cluster UUID", id="braces"),
            pytest.param("rack1.7", "is not a cluster UUID", id="name"),
            pytest.param("00000000-0000-0000-0000-000000000000.7", "all-zero cluster UUID", id="zero"),
            pytest.param("4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.-1", "clique id '-1'", id="negative"),
            pytest.param("4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.4294967296", "clique id", id="too-big"),
            pytest.param("4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.", "clique id ''", id="empty"),
        ],
    )
    def test_refusals_say_why(self, text: str, match: str) -> None:
        """Anything but <canonical UUID>.<uint32> is refused with the reason."""
        with pytest.raises(ValueError, match=match):
            parse_key(text)


class TestReadTray:
    def test_one_clique(self) -> None:
        """A registered tray: its key, healthy, one entry per GPU with every documented field."""
        tray_ = read_tray(FakeGpu(), "gb01")
        data = tray_.data()
        assert set(data) == DATA_KEYS and (data["fabric"], data["key"], data["reason"], data["error"]) == (
            "nvlink",
            FAKE_KEY,
            "",
            "",
        )
        assert [set(g) for g in data["gpus"]] == [GPU_KEYS] * 4 and data["gpus"][2]["clique_id"] == 7
        assert data["health"] == "no health summary (all GPUs)" and data["nvml"] is None

    def test_worst_health_names_its_gpus(self) -> None:
        """The tray's health is the worst GPU's, decoded, with the GPUs it applies to; no policy is applied."""
        bad = 0x1 << 4  # ROUTE_UNHEALTHY = TRUE
        gpu = FakeGpu([info(0, health_mask=0, health_summary=1), info(1, health_mask=bad, health_summary=2)])
        tray_ = read_tray(gpu, "gb01")
        assert tray_.key == FAKE_KEY and tray_.health == "UNHEALTHY: route unhealthy (GPU 1)"
        assert tray_.data()["gpus"][1]["health_problems"] == ["route unhealthy"]
        assert tray_.data()["gpus"][1]["health_summary"] == "UNHEALTHY"

    @pytest.mark.parametrize(
        ("infos", "reason"),
        [
            pytest.param([], "NVML reports no GPU", id="no-gpu"),
            pytest.param([None, info(1, state=nvml.STATE_NOT_SUPPORTED)], "no GPU supports", id="not-supported"),
            pytest.param([info(0, uuid_bytes=bytes(16))], "all-zero cluster UUID", id="zero-uuid"),
        ],
    )
    def test_no_fabric_has_a_reason(self, infos: list[Any], reason: str) -> None:
        """No multi-node fabric is an answer with the reason, not an error."""
        tray_ = read_tray(FakeGpu(infos), "gb01")
        assert (tray_.fabric, tray_.key, tray_.error) == ("none", None, "") and reason in tray_.reason

    def test_unsupported_gpu_has_every_field(self) -> None:
        """A GPU without fabric support is listed with the same fields, null where NVML gave nothing."""
        gpu = read_tray(FakeGpu([None]), "gb01").data()["gpus"][0]
        assert set(gpu) == GPU_KEYS and gpu["state"] == "NOT_SUPPORTED" and gpu["cluster_uuid"] is None

    def test_nvml_failure_is_an_error_never_no_fabric(self) -> None:
        """NVML failing gives fabric 'error' with the message and no key."""
        tray_ = read_tray(FakeGpu(error=GpuError("NVML init failed: boom")), "gb01")
        assert (tray_.fabric, tray_.key, tray_.reason, tray_.error) == ("error", None, "", "NVML init failed: boom")

    def test_pending_registration_is_an_error_with_the_gpus(self) -> None:
        """A registration in progress: an error (no waiting here), the GPUs still listed."""
        tray_ = read_tray(FakeGpu([info(0), info(1, state=nvml.STATE_IN_PROGRESS)]), "gb01")
        assert tray_.fabric == "error" and "GPU 1: NVLink fabric not attached" in tray_.error
        assert [g["state"] for g in tray_.data()["gpus"]] == ["COMPLETED", "IN_PROGRESS"]

    def test_text(self) -> None:
        """The text form: node, domain key, health, one line per GPU."""
        lines = render_text(read_tray(FakeGpu(), "gb01")).splitlines()
        assert lines[:3] == ["node: gb01", f"NVLink domain: {FAKE_KEY}", "fabric health: no health summary (all GPUs)"]
        assert lines[3].split()[:4] == ["GPU", "state", "status", "clique"] and len(lines) == 8
        assert lines[4].split()[:5] == ["0", "COMPLETED", "SUCCESS", "(0)", "7"]
        text = render_text(read_tray(FakeGpu([]), "gb01"))
        assert text == "node: gb01\nNVLink domain: none (no multi-node NVLink fabric: NVML reports no GPU)\n"


class TestCommand:
    def test_json_is_one_line_with_the_envelope(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints one line: the envelope every --json output has, the tray under 'data'."""
        assert main(["topology", "--json"], env={"SLURMD_NODENAME": "gb07"}, gpu=FakeGpu()) == 0
        out = capsys.readouterr().out
        assert out.count("\n") == 1
        doc = json.loads(out)
        assert (doc["status"], doc["exit_code"], doc["errors"]) == ("ok", 0, [])
        assert doc["data"]["node"] == "gb07" and doc["data"]["key"] == FAKE_KEY

    def test_node_name_option_and_host_name(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--node wins over $SLURMD_NODENAME; without either the short host name is used."""
        assert main(["topology", "--json", "--node", "x1"], env={"SLURMD_NODENAME": "gb07"}, gpu=FakeGpu()) == 0
        assert json.loads(capsys.readouterr().out)["data"]["node"] == "x1"
        assert main(["topology", "--json"], env={}, gpu=FakeGpu()) == 0
        import socket

        assert json.loads(capsys.readouterr().out)["data"]["node"] == socket.gethostname().split(".")[0]

    def test_bad_slurmd_nodename_is_an_error_in_the_envelope(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A $SLURMD_NODENAME that is no node name: exit 65, the one-line envelope says why, NVML not asked."""
        gpu = FakeGpu()
        assert main(["topology", "--json"], env={"SLURMD_NODENAME": "a/b"}, gpu=gpu) == 65
        out = capsys.readouterr().out
        doc = json.loads(out)
        assert out.count("\n") == 1 and doc["data"] is None and doc["errors"][0]["code"] == "job_env_invalid"
        assert gpu.calls == 0

    def test_bad_node_name_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--node must be one node name (no host list): usage error 64, NVML not asked."""
        gpu = FakeGpu()
        with pytest.raises(SystemExit) as info:
            main(["topology", "--node", "gb[01-02]"], env={}, gpu=gpu)
        assert info.value.code == 64 and "is not one node name" in capsys.readouterr().err and gpu.calls == 0

    def test_nvml_failure_exits_69_with_a_clean_answer(self, capsys: pytest.CaptureFixture[str]) -> None:
        """NVML failing: exit 69, the error in the envelope and in words, no traceback."""
        gpu = FakeGpu(error=GpuError("NVML init failed: no driver"))
        assert main(["topology", "--json"], env={"SLURMD_NODENAME": "gb01"}, gpu=gpu) == 69
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert (doc["status"], doc["exit_code"], doc["data"]["fabric"]) == ("error", 69, "error")
        assert doc["errors"] == [{"code": "gpu_failed", "message": "NVML init failed: no driver"}] and err == ""
        assert main(["topology"], env={"SLURMD_NODENAME": "gb01"}, gpu=gpu) == 69
        assert capsys.readouterr().out == "node: gb01\nNVLink domain: unknown (NVML init failed: no driver)\n"

    def test_output_feeds_topology_blocks(self, capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
        """Two trays' --json lines, as clush prints them, make one block of both."""
        lines = []
        for node in ("gb01", "gb02"):
            assert main(["topology", "--json", "--node", node], env={}, gpu=FakeGpu()) == 0
            lines.append(f"{node}: {capsys.readouterr().out}")
        import io

        monkeypatch.setattr("sys.stdin", io.StringIO("".join(lines)))
        assert main(["topology", "blocks"]) == 0
        assert f"BlockName=nvl-11111111-7 Nodes=gb[01-02]  # imexctl-key: {FAKE_KEY}" in capsys.readouterr().out


class TestStatus:
    @pytest.fixture
    def status(self, make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]) -> Any:
        def run(gpu: Any, *, json_out: bool = True, **sections: dict[str, Any]) -> tuple[int, Any]:
            cfg = str(make_settings(**sections).source)
            argv = ["--config", cfg, "status", *(["--json"] if json_out else [])]
            code = main(argv, env=job_env(), host=FakeHost(), gpu=gpu)
            out = capsys.readouterr().out
            return code, json.loads(out)["data"] if json_out else out

        return run

    def test_json_shows_key_and_health(self, status: Any) -> None:
        """status --json has the tray's NVLink domain key and fabric health."""
        code, data = status(FakeGpu())
        assert code == 0 and data["fabric"] == {
            "fabric": "nvlink",
            "key": FAKE_KEY,
            "health": "no health summary (all GPUs)",
            "reason": "",
            "error": "",
        }

    def test_text_shows_key(self, status: Any) -> None:
        """status (text) has a line with the key and health."""
        code, out = status(FakeGpu(), json_out=False)
        assert code == 0 and f"NVLink domain: {FAKE_KEY}, fabric health no health summary (all GPUs)" in out

    def test_nvml_failure_is_an_error_field_not_a_failure(self, status: Any) -> None:
        """A failing NVML read shows as the fabric's error; status still exits 0."""
        code, data = status(FakeGpu(error=GpuError("NVML init failed: boom")))
        assert code == 0 and data["fabric"]["error"] == "NVML init failed: boom" and data["fabric"]["key"] is None
        code, out = status(FakeGpu(error=GpuError("NVML init failed: boom")), json_out=False)
        assert "NVLink domain: unknown (NVML init failed: boom)" in out

    def test_fabric_none_does_not_ask_nvml(self, status: Any) -> None:
        """With [policy] fabric = none status does not read NVML and says so."""
        gpu = FakeGpu()
        code, data = status(gpu, policy={"fabric": "none"})
        assert code == 0 and data["fabric"] is None and gpu.calls == 0
        code, out = status(gpu, json_out=False, policy={"fabric": "none"})
        assert "NVLink domain: not checked ([policy] fabric = none)" in out and gpu.calls == 0


# ---------------------------------------------------------------- child processes: stand-in NVML, no NVML


def _topology_child(env: dict[str, str], *args: str, block_pynvml: bool = False) -> subprocess.CompletedProcess[str]:
    code = "import sys\n"
    if block_pynvml:
        code += "sys.modules['pynvml'] = None\n"  # import pynvml fails as where nvidia-ml-py is missing
    code += "from imexctl.cli import main\nsys.exit(main(['topology', *sys.argv[1:]]))\n"
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=full, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def stand_in(fake_nvml: dict[str, Path], tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run 'imexctl topology ARGS' over the stand-in library configured as given."""

    def run(config: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
        cfg = tmp_path / "nvml.conf"
        cfg.write_text("".join(f"{k} = {v}\n" for k, v in config.items()))
        env = {
            "LD_LIBRARY_PATH": str(fake_nvml["full"]),
            "FAKE_NVML_CONFIG": str(cfg),
            "FAKE_NVML_LOG": str(tmp_path / "nvml.log"),
        }
        return _topology_child(env, *args)

    return run


class TestStandInNvml:
    def test_r580_tray(self, stand_in: Any) -> None:
        """A healthy R580 tray: exit 0, its key with the UUID's NUL and high bytes intact, v3 health decoded."""
        done = stand_in(tray(), "--json", "--node", "gb01")
        assert done.returncode == 0 and done.stderr == ""
        data = json.loads(done.stdout)["data"]
        assert (data["node"], data["fabric"], data["key"], data["health"]) == (
            "gb01",
            "nvlink",
            KEY,
            "HEALTHY (all GPUs)",
        )
        assert [g["layout"] for g in data["gpus"]] == ["v3"] * 4
        assert (
            data["gpus"][0]["cluster_uuid"] == str(uuid.UUID(hex=UUID_HEX))
            and data["gpus"][0]["health_mask"] == HEALTHY
        )
        assert data["nvml"]["driver"] == "580.65.06"

    def test_r570_tray(self, stand_in: Any) -> None:
        """R570 answers v2: the same key, health without a summary."""
        done = stand_in(tray("r570"), "--json")
        data = json.loads(done.stdout)["data"]
        assert done.returncode == 0 and data["key"] == KEY and {g["layout"] for g in data["gpus"]} == {"v2"}
        assert data["health"] == "no health summary (all GPUs)"

    def test_unhealthy_gpu_is_reported_not_judged(self, stand_in: Any) -> None:
        """An UNHEALTHY GPU shows in the tray's health; the key is still reported (exit 0)."""
        bad_mask = HEALTHY & ~(0x3 << 4) | 0x1 << 4
        done = stand_in(tray(gpu2={"health_summary": 2, "health_mask": bad_mask}), "--json")
        data = json.loads(done.stdout)["data"]
        assert done.returncode == 0 and data["key"] == KEY and data["health"] == "UNHEALTHY: route unhealthy (GPU 2)"

    def test_no_fabric(self, stand_in: Any) -> None:
        """NOT_SUPPORTED on every GPU: exit 0, no key, the reason."""
        done = stand_in(tray(every={"error": 3}), "--json")
        data = json.loads(done.stdout)["data"]
        assert (
            done.returncode == 0
            and (data["fabric"], data["key"]) == ("none", None)
            and "no GPU supports" in data["reason"]
        )

    def test_failed_registration_with_a_zero_identity_exits_69(self, stand_in: Any) -> None:
        """COMPLETED with INSUFFICIENT_RESOURCES, a zero UUID and clique 0: fabric 'error' (exit 69), not 'none'."""
        done = stand_in(tray(every={"status": 23, "uuid": "00" * 16, "clique": 0}), "--json")
        doc = json.loads(done.stdout)
        assert done.returncode == 69 and (doc["data"]["fabric"], doc["data"]["reason"]) == ("error", ""), doc
        assert "NVML_ERROR_INSUFFICIENT_RESOURCES (23)" in doc["errors"][0]["message"]

    def test_pending_registration_exits_69(self, stand_in: Any) -> None:
        """A GPU still registering: exit 69 with the GPU named, every GPU listed."""
        done = stand_in(tray(gpu1={"state": 2}), "--json")
        doc = json.loads(done.stdout)
        assert done.returncode == 69 and doc["status"] == "error" and len(doc["data"]["gpus"]) == 4
        assert "GPU 1: NVLink fabric not attached (state IN_PROGRESS)" in doc["errors"][0]["message"]

    def test_text_form(self, stand_in: Any) -> None:
        """The text form over the stand-in: the key, then one line per GPU."""
        done = stand_in(tray(count=2), "--node", "gb01")
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.splitlines()[:2] == ["node: gb01", f"NVLink domain: {KEY}"]
        assert len(done.stdout.splitlines()) == 6


class TestWithoutNvml:
    def test_without_nvidia_ml_py(self) -> None:
        """pynvml cannot be imported: exit 69, a clean JSON answer naming nvidia-ml-py, nothing on stderr."""
        done = _topology_child({}, "--json", "--node", "gb01", block_pynvml=True)
        assert done.returncode == 69 and done.stderr == ""
        doc = json.loads(done.stdout)
        assert doc["data"]["fabric"] == "error" and "cannot import nvidia-ml-py" in doc["errors"][0]["message"]
        text = _topology_child({}, "--node", "gb01", block_pynvml=True)
        assert text.returncode == 69 and text.stderr == "" and "Traceback" not in text.stdout
        assert text.stdout.startswith("node: gb01\nNVLink domain: unknown (cannot import nvidia-ml-py")

    def test_without_the_library(self, tmp_path: Path) -> None:
        """No libnvidia-ml.so.1 anywhere: exit 69, NVML init failed, no traceback."""
        if ctypes.util.find_library("nvidia-ml"):
            pytest.skip("this machine has a real libnvidia-ml")
        done = _topology_child({"LD_LIBRARY_PATH": str(tmp_path)}, "--json")
        assert done.returncode == 69 and done.stderr == ""
        assert "NVML init failed" in json.loads(done.stdout)["errors"][0]["message"]
