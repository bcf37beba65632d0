"""The one composition root: ``runtime.build`` makes every command's node name, settings, logging, host and GPU."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

import pytest

from imexctl import slurm
from imexctl.config import schema
from imexctl.config.settings import Settings
from imexctl.hooks.runtime import Needs, build, with_gpu
from imexctl.platform.errors import ConfigError
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost

PACKAGE = Path(__file__).resolve().parents[2] / "imexctl"
#: what only the composition root calls: a command that called one of these would build its own runtime
ROOT_ONLY = {
    "load",  # config.settings.load
    "NvmlGpu",
    "RealHost",
    "configure_logging",
    "setup_command_logging",
    "setup_hook_logging",
    "open_command_sink",
}
#: where these are defined, or called for a reason of their own
ALLOWED = {
    "hooks/runtime.py",
    "platform/logsetup.py",  # defines the logging set-up (a crash's trace configures structlog)
    "config/settings.py",  # defines load
    "gpu/fabric.py",  # defines NvmlGpu
    "platform/host.py",  # defines RealHost
}


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            base = getattr(getattr(func, "value", None), "id", "")
            if name in ROOT_ONLY and (name != "load" or base == "settings"):
                names.add(name)
    return names


def test_no_command_builds_its_own_runtime() -> None:
    """Settings, logging, host and NVML are made in ``hooks/runtime.py`` only (the hooks' entry, status, doctor,
    netcheck, topology, health, why and preflight all call ``build``)."""
    found = {
        str(p.relative_to(PACKAGE)): calls
        for p in PACKAGE.rglob("*.py")
        if str(p.relative_to(PACKAGE)) not in ALLOWED and not p.is_relative_to(PACKAGE / "sim")
        if (calls := _calls(p))
    }
    assert found == {}
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "build(" in p.read_text(encoding="utf-8")}
    assert users >= {
        "hooks/entry.py",
        "commands/status.py",
        "commands/netcheck.py",
        "commands/topology.py",
        "commands/health.py",
        "commands/why.py",
        "commands/preflight.py",
        "doctor/run.py",
    }


@pytest.fixture
def broken(root: Path) -> str:
    return str(write_config(root, {"readiness": {"deadline": "5"}}))


def test_a_config_that_does_not_load_fails_strict_and_is_the_problem_lenient(broken: str) -> None:
    """strict: ConfigError naming the key; lenient: the built-in defaults, and the same text as the problem."""
    env = {"SLURMD_NODENAME": "gb01"}
    with pytest.raises(ConfigError, match=r"\[readiness\] deadline") as exc:
        build("status", env, Needs(logs="none", gpu="none"), config=broken, host=FakeHost())
    built = build("doctor", env, Needs(logs="none", gpu="none", config="lenient"), config=broken, host=FakeHost())
    assert built.problem == str(exc.value) and built.rt.settings.source is None and built.path == broken
    assert built.node == "gb01"


def test_an_admins_command_reads_the_hooks_file_under_slurmd(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SLURM_CONF an admin's command looks up the config as slurmd's hooks would (beside slurmd's
    slurm.conf); a hook only as its own environment says."""
    conf = root / "etc/slurm/slurm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("ClusterName=x\n")
    beside = conf.parent / "imexctl.conf"
    beside.write_text(f"[paths]\nroot = {root}\n")
    beside.chmod(0o644)
    monkeypatch.setattr(slurm, "SLURMD_CONFS", (str(conf),))
    env = {"SLURMD_NODENAME": "gb01"}
    admin = build("status", env, Needs(logs="none", gpu="none"), host=FakeHost())
    hook = build("prolog", env, Needs(logs="none", gpu="none", hook_lookup=True), host=FakeHost())
    assert (admin.path, admin.lookup["SLURM_CONF"], admin.rt.settings.source) == (str(beside), str(conf), beside)
    assert hook.path == schema.DEFAULT_CONFIG and "SLURM_CONF" not in hook.lookup


def test_nvml_only_when_asked(make_settings: Callable[..., Settings]) -> None:
    """``gpu = none`` makes no GPU (the hooks' early paths never ask NVML); ``policy`` follows [policy] fabric;
    ``with_gpu`` adds NVML later, and keeps a GPU given."""
    env = {"SLURMD_NODENAME": "gb01"}
    none = str(make_settings(policy={"fabric": "none"}).source)
    assert build("health", env, Needs(logs="none", gpu="policy"), config=none, host=FakeHost()).rt.gpu is None
    nvml = str(make_settings(policy={"fabric": "nvml"}).source)
    assert build("prolog", env, Needs(logs="none", gpu="none"), config=nvml, host=FakeHost()).rt.gpu is None
    made = build("health", env, Needs(logs="none", gpu="policy"), config=nvml, host=FakeHost()).rt.gpu
    assert type(made).__name__ == "NvmlGpu"
    rt = build("prolog", env, Needs(logs="none", gpu="none"), config=nvml, host=FakeHost()).rt
    assert type(with_gpu(rt).gpu).__name__ == "NvmlGpu"
    fake = FakeGpu()
    assert with_gpu(rt._replace(gpu=fake)).gpu is fake
