"""The Ansible role without a lab: ansible-playbook parses it, its README names every variable it has.

test_role.py runs it against booted nodes (marker systemd).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "deploy/ansible/roles/imexctl"


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible (bash .ci/setup test)")
def test_the_example_playbook_and_the_role_parse(tmp_path: Path) -> None:
    """ansible-playbook --syntax-check accepts site.yml with the role (its tasks, handlers and templates' names)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", "localhost,", str(REPO / "deploy/ansible/site.yml")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_names_every_variable() -> None:
    """Each variable of defaults/main.yml is in the role's README (its defaults file says the rest)."""
    names = re.findall(r"^(imexctl_\w+):", (ROLE / "defaults/main.yml").read_text(), re.MULTILINE)
    readme = (ROLE / "README.md").read_text()
    assert names and [n for n in names if f"`{n}`" not in readme] == []


def test_every_variable_the_tasks_use_has_a_default() -> None:
    """No task reads an ``imexctl_`` variable that defaults/main.yml does not define."""
    defined = set(re.findall(r"^(imexctl_\w+):", (ROLE / "defaults/main.yml").read_text(), re.MULTILINE))
    used = set()
    for path in [
        *ROLE.glob("tasks/*.yml"),
        *ROLE.glob("handlers/*.yml"),
        *ROLE.glob("templates/*.j2"),
        *ROLE.glob("vars/*.yml"),
    ]:
        used |= set(re.findall(r"(?<![\w.])(imexctl_\w+)", path.read_text()))
    assert used - defined == set()
