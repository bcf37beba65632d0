"""The Ansible role without a lab: ansible-playbook parses it, site.yml's plays stop where they must, its README
names every variable it has.

test_role.py runs it against booted nodes (marker systemd).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "deploy/ansible/roles/imexctl"


NEEDS_ANSIBLE = pytest.mark.skipif(
    shutil.which("ansible-playbook") is None, reason="needs ansible (bash .ci/setup test)"
)


def _env(home: Path) -> dict[str, str]:
    """A clean environment for ansible-playbook, its home in ``home``."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": str(home), "ANSIBLE_NOCOLOR": "1"}


@NEEDS_ANSIBLE
def test_the_example_playbook_and_the_role_parse(tmp_path: Path) -> None:
    """ansible-playbook --syntax-check accepts site.yml with the role (its tasks, handlers and templates' names)."""
    env = _env(tmp_path)
    done = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", "localhost,", str(REPO / "deploy/ansible/site.yml")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@NEEDS_ANSIBLE
def test_the_task_files_of_their_own_plays_parse(tmp_path: Path) -> None:
    """topology.yml and prometheus.yml, which site.yml includes when it runs, parse when imported statically
    (--syntax-check does not load an include_role's tasks)."""
    play = "".join(
        f"- hosts: all\n  tasks:\n    - ansible.builtin.import_role:\n        name: imexctl\n        tasks_from: {name}\n"
        for name in ("topology.yml", "prometheus.yml")
    )
    (tmp_path / "plays.yml").write_text(f"---\n{play}")
    env = {**_env(tmp_path), "ANSIBLE_ROLES_PATH": str(ROLE.parent)}
    done = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", "localhost,", str(tmp_path / "plays.yml")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@NEEDS_ANSIBLE
def test_site_yml_ends_the_rollout_with_the_batch_of_a_failed_or_unreachable_tray(tmp_path: Path) -> None:
    """The trays' play goes in batches; a batch with a failed or unreachable tray finishes (no
    max_fail_percentage, no any_errors_fatal: they would skip the handlers of its other trays), handlers run on
    a failed tray too, and its last task then fails the rest, which ends the run; the topology play is all
    trays or none. tests/ansible/test_role.py shows each on booted nodes; this holds the file to it where no
    lab runs."""
    ansible = Path(str(shutil.which("ansible-playbook"))).read_text().splitlines()[0].removeprefix("#!").split()
    code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    done = subprocess.run(
        [*ansible, "-c", code, str(REPO / "deploy/ansible/site.yml")],
        capture_output=True, text=True, timeout=60, env=_env(tmp_path), check=True,
    )  # fmt: skip
    trays, topology, rules = json.loads(done.stdout)
    assert trays["hosts"] == topology["hosts"] == "gb200_trays" and rules["hosts"] == "prometheus"
    assert trays["serial"] == "{{ imexctl_serial | default([1, 17, 18]) }}" and trays["force_handlers"] is True
    assert "max_fail_percentage" not in trays and "any_errors_fatal" not in trays
    (last,) = trays["post_tasks"]
    assert "ansible.builtin.fail" in last
    assert last["when"] == "ansible_play_hosts_all | difference(ansible_play_hosts) | length > 0"
    assert topology["any_errors_fatal"] is True and "serial" not in topology


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
