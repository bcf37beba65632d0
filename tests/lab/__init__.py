"""A real multi-node Slurm cluster on one machine, for imexctl's integration tests.

One ``slurmctld`` and one ``slurmd`` per network namespace, each with its own UTS hostname, so that a
real slurmd runs this checkout's ``hooks/prolog`` and ``hooks/epilog`` on every node of a job. Two
Slurm versions (see :mod:`tests.lab.versions`): Debian 12's Slurm 22.05 from the host, and Debian 13's
Slurm 24.11 from a Debian root built once by :mod:`tests.lab.debroot` and run with ``chroot``.

A second mode, the lab of booted nodes (:mod:`tests.lab.sysd`), boots the same Debian 13 root as
containers with systemd as PID 1 (``systemd-nspawn -b`` on an overlay per machine, never the root itself):
a controller running ``slurmctld.service``, compute nodes running ``munge.service`` and ``slurmd.service``,
imexctl installed on them by docs/install.md's own commands (:mod:`tests.lab.siteinstall`) and the default
``[daemon] backend = systemd``, so the prolog starts ``imexctl-imex@<job>.service`` under a real systemd.
Its tests are ``pytest -m systemd`` (tests/systemd/).

Modules: ``procs`` (processes and commands), ``debroot`` (the cached Debian 13 root and its wheelhouse),
``versions`` (how each Slurm runs), ``cluster`` (:class:`~tests.lab.cluster.SlurmLab`: bring-up, teardown,
queries), ``jobs`` (job and check helpers for tests and benchmarks), ``churn`` (a seeded job churn with faults
on a lab of its own, and the oracle that checks it: issue 43's soaks), ``conftest`` (the pytest fixtures),
``test_*`` (the tests, ``pytest -m slurm``), ``nspawn`` (a booted container), ``sysd``
(:class:`~tests.lab.sysd.SystemdLab`), ``siteinstall`` (docs/install.md's commands), ``__main__``
(``python3 -m tests.lab`` for humans, ``--systemd`` for the booted nodes).
"""
