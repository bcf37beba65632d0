"""imexctl installed on a booted node the way docs/install.md tells a site to, command by command.

:data:`STEPS` are the page's commands for a compute node with the systemd backend, verbatim, in the page's
order; only the page's placeholders are filled in (:data:`PLACEHOLDERS`). The lab runs each one as root
inside the container with ``/bin/sh -ec``, in the node's copy of the checkout (:data:`CHECKOUT`, where
``hooks/...``, ``systemd/...`` and the site's ``imexctl.conf`` lie). :data:`NOT_RUN` lists the page's other
node commands and why the lab does not run them; tests/systemd/test_install_steps.py checks that both lists
together are exactly the page's commands, so the page and the lab cannot drift apart.

Switching to the Debian package (issue 12) is :func:`install_imexctl`: its body becomes ``dpkg -i``.

Decisions, written down:

- **Where the code comes from.** The containers have no network. The page's offline variant is used: the
  host's pip fetches the dependencies and setuptools once for the root's Python (debroot.ensure_wheelhouse,
  the page's ``pip download`` run off the node), bind-mounted read-only at :data:`WHEELS`; the checkout is
  copied (package, hooks, units; no caches) into the node's disk at :data:`CHECKOUT`, because pip builds in
  the source tree, which must neither be the host's checkout nor read-only.
- **The root's own venv** (made by debroot.py for the chroot lab) is removed from the node's disk first, so
  the page's ``python3 -m venv`` starts from nothing, as on a new node.
- **The NVIDIA side** is a stand-in package the lab provides before boot (sysd.py): ``/usr/bin/nvidia-imex``
  and ``/usr/bin/nvidia-imex-ctl`` run the simulator, and ``nvidia-imex.service`` is installed and enabled
  like the real package's unit, so the page's ``disable --now`` and ``mask`` meet a running unit. imexctl's
  ``[commands]`` therefore keep their defaults and the shipped unit runs unchanged (no drop-in).
"""

from __future__ import annotations

from tests.lab.nspawn import Container

__all__ = [
    "CHECKOUT",
    "CHECKS",
    "NOT_RUN",
    "PLACEHOLDERS",
    "SLURM_CONF",
    "STEPS",
    "WHEELS",
    "configure_node",
    "install_imexctl",
    "run_steps",
]

#: the node's copy of the checkout (the page's /path/to/imexctl); the commands run here
CHECKOUT = "/usr/local/src/imexctl"
#: wheels of imexctl's dependencies and setuptools for the node's Python (the page's /path/to/wheels)
WHEELS = "/opt/imexctl-wheels"
PLACEHOLDERS = {"/path/to/imexctl": CHECKOUT, "/path/to/wheels": WHEELS}

#: section 3: the lines of slurm.conf the page asks for (the lab's slurm.conf has each of them)
SLURM_CONF = (
    "Prolog=/etc/slurm/prolog.d/*",
    "Epilog=/etc/slurm/epilog.d/*",
    "PrologFlags=Alloc,DeferBatch",
    "PrologEpilogTimeout=120",
)
#: section 1: the Python environment (what a .deb would replace)
VENV_STEPS = (
    (
        "/usr/bin/python3 -m venv /opt/imexctl && "
        "/opt/imexctl/bin/pip install --no-index --find-links /path/to/wheels /path/to/imexctl"
    ),
)
#: sections 2, 4 and 5: hooks, units, the stock unit, the configuration file
NODE_STEPS = (
    "install -d -m 0755 /etc/slurm/prolog.d /etc/slurm/epilog.d",
    "install -o root -g root -m 0755 hooks/prolog /etc/slurm/prolog.d/00-imexctl",
    "install -o root -g root -m 0755 hooks/epilog /etc/slurm/epilog.d/99-imexctl",
    "install -o root -g root -m 0644 systemd/imexctl-imex@.service /etc/systemd/system/",
    "systemctl daemon-reload",
    "install -o root -g root -m 0644 systemd/imexctl-cleanup.service /etc/systemd/system/",
    "systemctl enable imexctl-cleanup.service",
    "systemctl disable --now nvidia-imex.service",
    "systemctl mask nvidia-imex.service",
    "install -d -m 0755 /etc/imexctl",
    "install -o root -g root -m 0644 imexctl.conf /etc/imexctl/imexctl.conf",
)
STEPS = VENV_STEPS + NODE_STEPS

#: the page's checks of a prepared node that apply without a GPU (section 1, the rollout checklist):
#: (command, text in its output)
CHECKS = (
    ("/opt/imexctl/bin/imexctl --version", "imexctl "),
    ("/opt/imexctl/bin/imexctl status", "no IMEX domain on this node"),
    ("systemctl show -p LoadState,ExecStart imexctl-imex@1.service", "LoadState=loaded"),
    ("systemctl is-enabled nvidia-imex.service", "masked"),
    ("systemctl is-enabled imexctl-cleanup.service", "enabled"),
)

PACKAGE = (
    "the package path; the lab installs without a package (a .deb serves the one Python minor version it was "
    "built for, and none is built here for the nodes' Debian 13 Python 3.13): install_imexctl is where it would go"
)
#: the page's other commands for a node (trailing comments dropped), and why the lab does not run them
#: the port guard needs bpf(), which nspawn's default filter refuses: tests/systemd/test_port_guard.py boots nodes
#: of its own that allow it and installs the guard there
GUARD = "the port guard: tests/systemd/test_port_guard.py, on nodes that may load BPF programs"
#: firewalld's branch of the same: the lab's nodes have no firewall; tests/ansible/test_role.py opens the ranges
#: with firewalld on a booted node of its own (the role's service, the same rule)
FIREWALLD = (
    "opens the ports with firewalld; the lab's nodes have none (tests/ansible/test_role.py has a firewalld node)"
)
NOT_RUN = {
    "apt-get install ./imexctl_0.1.0_arm64.deb": PACKAGE,
    "dnf install ./imexctl-0.1.0-1.aarch64.rpm": "the RPM, for RHEL and Rocky; the nodes are Debian",
    "imexctl --version && imexctl doctor": (
        "the package's /usr/sbin/imexctl; the lab checks /opt/imexctl/bin/imexctl --version (doctor also checks "
        "NVML and the driver, which the nodes do not have)"
    ),
    "apt-get install debhelper dpkg-dev fakeroot python3-pip python3-setuptools python3-wheel": "builds packages",
    "dpkg-buildpackage -us -uc -b": "builds the .deb, off the node",
    'rpmbuild -bb --define "_sourcedir $PWD/dist" pkg/rpm/imexctl.spec': "builds the RPM, off the node",
    "python3 pkg/wheels.py download /srv/imexctl-wheels": "fetches the wheels for building packages",
    "apt-get install rpm python3-build python3-pip python3-setuptools python3-wheel": "builds packages",
    "python3 -m build --sdist --no-isolation": "builds the sdist, off the node",
    'rpmbuild -bb --nodeps --define "_sourcedir $PWD/dist" pkg/rpm/imexctl.spec': "builds the RPM, off the node",
    "IMEXCTL_WHEELS=/srv/imexctl-wheels dpkg-buildpackage -us -uc -b": "builds the .deb, off the node",
    'rpmbuild -bb --define "_sourcedir $PWD/dist" --define "wheels /srv/imexctl-wheels" pkg/rpm/imexctl.spec': (
        "builds the RPM, off the node"
    ),
    "ln -s /usr/share/imexctl/hooks/prolog /etc/slurm/prolog.d/00-imexctl": PACKAGE,
    "ln -s /usr/share/imexctl/hooks/epilog /etc/slurm/epilog.d/99-imexctl": PACKAGE,
    "/usr/bin/python3 -m venv /opt/imexctl && /opt/imexctl/bin/pip install imexctl": (
        "installs from an index; the containers have no network (the offline variant runs)"
    ),
    "/usr/bin/python3 -m venv /opt/imexctl && /opt/imexctl/bin/pip install /path/to/imexctl": (
        "needs an index for the dependencies; the containers have no network (the offline variant runs)"
    ),
    "exec /opt/imexctl/bin/imexctl prolog": "what hooks/prolog runs, not a command (tests/test_docs.py checks it)",
    "exec /opt/imexctl/bin/imexctl epilog": "what hooks/epilog runs, not a command (tests/test_docs.py checks it)",
    "install -D -m 0644 /usr/share/imexctl/systemd/port-guard.slice.conf \\": GUARD,
    "/etc/systemd/system/user.slice.d/imexctl-port-guard.conf": GUARD,
    "systemd-run --slice=user.slice --wait --quiet --collect /bin/true": GUARD,
    'for opt in --permanent ""; do': FIREWALLD,
    (
        'firewall-cmd $opt --add-rich-rule=\'rule family="ipv4" source address="<rack subnet>" '
        'port port="61000-62999" protocol="tcp" accept\''
    ): FIREWALLD,
    "done": FIREWALLD,
    "nft add rule inet filter input ip saddr <rack subnet> tcp dport 61000-62999 accept": (
        "opens the ports between trays; the lab's network namespaces have no firewall"
    ),
    "python3 -m pip download -d /path/to/wheels /path/to/imexctl setuptools": (
        "runs off the node, on a machine with network; the host fetches the same wheels for the root's "
        "Python (debroot.ensure_wheelhouse)"
    ),
}


def _fill(line: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    return line


def run_steps(node: Container, steps: tuple[str, ...]) -> None:
    """Run the page's commands as root on the node, in its copy of the checkout."""
    for line in steps:
        node.shell(_fill(line), cwd=CHECKOUT, timeout=300)


def install_imexctl(node: Container) -> None:
    """Put imexctl into its documented prefix: the page's section 1 (a .deb: ``dpkg -i`` here instead)."""
    run_steps(node, VENV_STEPS)


def configure_node(node: Container) -> None:
    """Install hooks and units, retire the stock unit, install the configuration; then run the checks."""
    run_steps(node, NODE_STEPS)
    for line, want in CHECKS:
        res = node.exec(["/bin/sh", "-c", line], cwd=CHECKOUT, check=False)
        if want not in res.stdout:
            raise AssertionError(f"{node.name}: `{line}` printed {res.stdout!r} {res.stderr!r}, want {want!r}")
