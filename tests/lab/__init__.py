"""A real multi-node Slurm cluster on one machine, for imexctl's integration tests.

One ``slurmctld`` and one ``slurmd`` per network namespace, each with its own UTS hostname, so that a
real slurmd runs this checkout's ``hooks/prolog`` and ``hooks/epilog`` on every node of a job. Two
Slurm versions (see :mod:`tests.lab.versions`): Debian 12's Slurm 22.05 from the host, and Debian 13's
Slurm 24.11 from a Debian root built once by :mod:`tests.lab.debroot` and run with ``chroot``.

Modules: ``procs`` (processes and commands), ``debroot`` (the cached Debian 13 root), ``versions`` (how
each Slurm runs), ``cluster`` (:class:`~tests.lab.cluster.SlurmLab`: bring-up, teardown, queries),
``jobs`` (job and check helpers for tests and benchmarks), ``conftest`` (the pytest fixtures),
``test_*`` (the tests, ``pytest -m slurm``), ``__main__`` (``python3 -m tests.lab`` for humans).
"""
