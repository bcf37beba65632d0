"""Command line: argparse and dispatch; the one place that maps errors to exit codes.

The console script imports this module for every hook run: at module level it
imports only ``os`` and ``sys``.  :func:`main` first offers the command line
to :mod:`imexctl.hooks.quick` (a prolog that policy skips, an epilog with nothing
to do), then parses it with argparse (docs/performance.md).
"""

from __future__ import annotations

import os
import sys

from imexctl import __version__

# typing and argparse are not imported at run time before they are needed; mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any, Callable, NoReturn

    from imexctl.platform.errors import ImexctlError

__all__ = ["console", "main"]

_HOOK_HELP = "reads the job from slurmd's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME, ...)"


def _top_parser() -> argparse.ArgumentParser:
    """The top-level parser: the sysexits usage code (64) instead of 2, and the exit codes in ``--help``."""
    import argparse

    from imexctl.platform.errors import ExitCode

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            self.print_usage(sys.stderr)
            self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message}\n")

    epilog = "exit codes: " + "; ".join(f"{int(c)} {c.meaning}" for c in ExitCode) + " (docs/exit-codes.md)."
    return _Parser(prog="imexctl", description="Per-job NVIDIA IMEX domains for Slurm.", epilog=epilog)


def _parser() -> argparse.ArgumentParser:
    p = _top_parser()
    p.add_argument("--version", action="version", version=f"imexctl {__version__}")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default: $IMEXCTL_CONFIG, imexctl.conf beside $SLURM_CONF, /etc/imexctl/imexctl.conf)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also print info-level log lines on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("prolog", help="set up this job's IMEX domain (Slurm Prolog=)", description=_HOOK_HELP)
    sub.add_parser("epilog", help="tear down this job's IMEX domain (Slurm Epilog=)", description=_HOOK_HELP)
    st = sub.add_parser("status", help="show this node's IMEX domain, channels and stale state")
    form = st.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    form.add_argument("--prometheus", action="store_true", help="the domain gauges in Prometheus text format")
    dr = sub.add_parser("doctor", help="check this tray and slurm.conf before a job does (exit 1 on a FAIL)")
    dr.add_argument("--json", action="store_true", help="the checks as JSON: name, status, message, fix")
    dr.add_argument("--slurm-conf", metavar="FILE", help="slurm.conf to check (default: $SLURM_CONF, /etc/slurm)")
    dr.add_argument("--nodes", metavar="LIST", default="", help="also resolve these trays (a host list, e.g. a rack)")
    _netcheck_parser(sub)
    cl = sub.add_parser("cleanup", help="reset the node after failed jobs")
    cl.add_argument("--job", type=int, metavar="ID", help="only this job")
    cl.add_argument("--dry-run", action="store_true", help="show what would be done")
    cl.add_argument("--force", action="store_true", help="also tear down jobs that still run here")
    cl.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    hl = sub.add_parser("hostlist", help="expand or fold Slurm node lists (no slurmctld needed)")
    hsub = hl.add_subparsers(dest="hostlist_command", metavar="ACTION", required=True)
    ex = hsub.add_parser("expand", help="one host per line, like 'scontrol show hostnames'")
    ex.add_argument("expr", nargs="+", metavar="EXPR")
    fo = hsub.add_parser("fold", help="compressed list, like 'scontrol show hostlist'")
    fo.add_argument("names", nargs="*", metavar="NAME", help="names (default: read from stdin)")
    _container_parsers(sub)
    _topology_parser(sub)
    de = sub.add_parser("demo", help="run a multi-tray job on the IMEX simulator (no GPU needed)")
    de.add_argument("--trays", type=int, default=4, metavar="N", help="simulated trays (default 4, at most 64)")
    de.add_argument("--fault", metavar="NAME", help="inject a simulator fault (see 'imexctl demo --help')")
    de.add_argument("--keep", action="store_true", help="keep the demo's temporary directory")
    return p


def _netcheck_parser(sub: Any) -> None:
    nc = sub.add_parser(
        "netcheck",
        help="prove both per-job port ranges are open between trays (srun -N<n> --ntasks-per-node=1, any user)",
    )
    nc.add_argument("--timeout", type=float, default=15.0, metavar="S", help="retry window per pair (default 15 s)")


def _topology_parser(sub: Any) -> None:
    tp = sub.add_parser("topology", help="this tray's NVLink domain from NVML ('blocks': Slurm blocks from many trays)")
    tp.add_argument("--json", action="store_true", help="one JSON object on one line (what 'topology blocks' reads)")
    tp.add_argument(
        "--node",
        type=_node_name,
        metavar="NAME",
        help="node name to report (default: $SLURMD_NODENAME, short host name)",
    )
    tsub = tp.add_subparsers(dest="topology_command", metavar="ACTION")
    bl = tsub.add_parser("blocks", help="Slurm topology blocks from 'imexctl topology' reports of many trays")
    bl.add_argument("files", nargs="*", metavar="FILE", help="report files (default and '-': stdin)")
    form = bl.add_mutually_exclusive_group()
    form.add_argument("--yaml", action="store_true", help="topology.yaml (Slurm 25.05+) instead of topology.conf")
    form.add_argument("--map", action="store_true", help="a NODE KEY map (for source = map, topology_map)")
    bl.add_argument("--block-sizes", type=_block_sizes, metavar="N[,N...]", help="BlockSizes to write, e.g. 18")
    bl.add_argument("--topology-name", default="nvlink", metavar="NAME", help="with --yaml: its name (default nvlink)")


def _node_name(text: str) -> str:
    import argparse

    from imexctl.platform.errors import NodeListError
    from imexctl.slurm import nodelist

    try:
        nodelist.fold([text])
    except NodeListError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not one node name: {exc.reason}") from None
    return text


def _block_sizes(text: str) -> tuple[int, ...]:
    import argparse

    from imexctl.slurm.blocks import parse_block_sizes

    try:
        return parse_block_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _container_parsers(sub: Any) -> None:
    """The job user's commands (docs/containers.md)."""
    sub.add_parser(
        "task-prolog",
        help="print 'export NVIDIA_IMEX_CHANNELS=<N>' for a task of a job with a channel here (Slurm TaskProlog=)",
        description="runs as the job's user; always exits 0 and never writes to stderr (docs/containers.md)",
    )
    sub.add_parser(
        "enroot-hook",
        help="show an enroot container exactly the job's IMEX channel (/etc/enroot/hooks.d)",
        description="reads ENROOT_ROOTFS, ENROOT_ENVIRON and SLURM_JOB_ID (docs/containers.md)",
    )


def console() -> NoReturn:
    """The ``imexctl`` console script: :func:`main`, and for a hook an exit without the interpreter's teardown.

    slurmd waits for the hook's process to end.  After a full prolog or
    epilog, Python's finalisation (module teardown, garbage collection of what
    structlog, tenacity and imexctl loaded) takes 18 to 30 ms more on this
    machine, against 2.5 ms for ``os._exit`` (docs/performance.md).  Nothing
    of a hook's needs it: the log file is flushed line by line, state and
    config files are written atomically with fsync, and stdout and stderr are
    flushed here.  Every other command exits normally.
    """
    from imexctl.hooks.quick import hook_args

    code = main()
    if hook_args(sys.argv[1:]) is None:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    host: Any = None,
    gpu: Any = None,
    on_step: Callable[[str], None] | None = None,
) -> int:
    """Run one command; returns the exit code.

    Tests call this directly, with fakes for ``host`` and ``gpu``, and
    ``on_step`` to act at each step boundary of a hook (fault injection).
    """
    read = None
    if host is None and gpu is None and on_step is None:
        from imexctl.hooks import quick

        try:
            done, read = quick.start(sys.argv[1:] if argv is None else argv, os.environ if env is None else env)
        except Exception:  # a bug there must not fail a hook: the full command decides (tests call quick.run)
            done, read = None, None
        if done is not None:
            return done
    from imexctl.platform.errors import ExitCode, ImexctlError

    args = _parser().parse_args(argv)
    env = dict(os.environ) if env is None else dict(env)
    try:
        if args.command == "hostlist":
            return _cmd_hostlist(args)
        if args.command in ("task-prolog", "enroot-hook"):
            return _cmd_container(args, env)
        if args.command == "topology":
            return _cmd_topology(args, env, gpu)
        if args.command == "doctor":
            return _cmd_doctor(args, env, host, gpu)
        if args.command == "netcheck":
            return _cmd_netcheck(args, env, host)
        if args.command == "demo":
            return _cmd_demo(args)
        return _with_runtime(args, env, host, gpu, on_step, read)
    except ImexctlError as exc:
        if not exc.logged:
            _log_failure(exc)
        if args.command in ("status", "cleanup", "topology", "doctor") and getattr(args, "json", False):
            _print_json(None, errors=[exc], indent=None if args.command == "topology" else 2)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug: leave a structured trace, never a bare traceback in slurmd's log only
        _log_crash()
        return int(ExitCode.SOFTWARE)


def _cmd_demo(args: argparse.Namespace) -> int:
    """``imexctl demo``; the .deb and the .rpm leave the simulator out (docs/install.md)."""
    import importlib.util

    from imexctl.platform.errors import ExitCode

    if importlib.util.find_spec("imexctl.commands.demo") is None or importlib.util.find_spec("imexctl.sim") is None:
        sys.stderr.write(
            "imexctl demo: the simulator is not installed here (the node packages leave it out);"
            " run the demo from a checkout (bash .ci/setup demo) or a pip install of imexctl\n"
        )
        return int(ExitCode.UNAVAILABLE)
    from imexctl.commands import demo

    return int(demo.run(trays=args.trays, fault=args.fault, keep=args.keep))


def _with_runtime(
    args: argparse.Namespace,
    env: dict[str, str],
    host: Any,
    gpu: Any,
    on_step: Callable[[str], None] | None,
    read: Any = None,
) -> int:
    """Run a command that needs the settings: a hook, ``status`` or ``cleanup``.

    ``read`` is what the hooks' fast path read before it declined
    (``quick.Read``): the settings are then built from its validated sections
    and the job is its job, neither read again.
    """
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.errors import NotPrivilegedError
    from imexctl.platform.host import RealHost
    from imexctl.slurm import job as slurm

    host = host if host is not None else RealHost()
    # checked before it reaches a path: [paths] root may hold %n
    node = slurm.node_name(env, or_host=True)
    cfg = _settings(args, env, node, read)
    sink, problem = _open_sink(cfg, args)
    job = _hook_job(args, env, read)
    early = job is not None and not problem and host.euid() == 0
    if early and _quick_hook(args, job, Runtime(host, gpu, cfg, _line_logger(sink, cfg, args, env))):
        return 0
    _configure_logging(cfg, args, env, (sink, problem))
    if args.command in ("prolog", "epilog", "cleanup") and host.euid() != 0:
        raise NotPrivilegedError(f"imexctl {args.command} must run as root")
    if gpu is None:
        from imexctl.gpu.fabric import NvmlGpu

        gpu = NvmlGpu()
    import structlog

    rt = Runtime(host, gpu, cfg, structlog.get_logger(), **({"on_step": on_step} if on_step else {}))
    if args.command == "status":
        return _cmd_status(args, rt, node)
    return _run_hook(args, env, rt, job)


def _settings(args: argparse.Namespace, env: Mapping[str, str], node: str, read: Any) -> Any:
    """The settings: from what the fast path read (``quick.Read``), else read and validated here."""
    from pathlib import Path

    from imexctl.config import schema, settings
    from imexctl.platform.errors import ImexctlError

    if read is not None:
        source = Path(read.config) if read.found else None
        return settings.from_values(read.values, read.imex, node=node, source=source)
    # an admin's command reads the file the hooks read under slurmd (issue 23)
    lookup = env if args.command in ("prolog", "epilog") else schema.as_under_slurmd(env)
    path, required = schema.find_config(args.config, lookup)
    try:
        return settings.load(path, node=node, required=required)
    except ImexctlError:
        _configure_logging(None, args, env)  # no log file known: the error goes to stderr
        raise


def _hook_job(args: argparse.Namespace, env: Mapping[str, str], read: Any) -> Any:
    """The hook's job, read once for the whole run: the fast path's, else from ``env``.

    None for a command that is no hook, or when the environment is invalid:
    the hook then reads it again and reports the problem, as it always does.
    """
    if args.command not in ("prolog", "epilog"):
        return None
    if read is not None:
        return read.job
    from imexctl.platform.errors import ImexctlError
    from imexctl.slurm.job import JobContext

    try:
        return JobContext.from_env(env, need_nodes=args.command == "prolog")
    except ImexctlError:
        return None


def _quick_hook(args: argparse.Namespace, job: Any, rt: Any) -> bool:
    """Finish a prolog that policy skips, or an epilog with nothing to do, before structlog is imported.

    The decisions are the fast path's own (``gate``), here with the settings
    and the given host: a site with metrics, a log directory still to make,
    or a test's fake host comes here.
    ``rt`` carries a ``log.LineLogger`` and, when none was given, no GPU:
    these paths never ask NVML.  False (nothing logged) when the full hook
    must run (docs/performance.md).
    """
    t0 = rt.host.monotonic()
    result: Any
    if args.command == "prolog":
        from imexctl.hooks.gate import idle_prolog

        result = idle_prolog(job, rt)
    else:
        from imexctl.hooks.teardown import idle_epilog

        result = idle_epilog(job, rt)
    if result is None:
        return False
    _record_metrics(rt, args.command, result, None, rt.host.monotonic() - t0)
    return True


def _run_hook(args: argparse.Namespace, env: Mapping[str, str], rt: Any, job: Any = None) -> int:
    """Run the prolog, the epilog or cleanup, then count it in the metrics (the one place that does)."""
    t0 = rt.host.monotonic()
    result: Any = None
    error: BaseException | None = None
    try:
        if args.command == "prolog":
            from imexctl.hooks.prolog import prolog

            result = prolog(env, rt, job)
        elif args.command == "epilog":
            from imexctl.hooks.teardown import epilog

            result = epilog(env, rt, job)
        else:
            from imexctl.hooks.teardown import cleanup

            result = cleanup(rt, job_id=args.job, dry_run=args.dry_run, force=args.force)
            _print_json(result.data()) if args.json else _print_cleanup(result)
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not getattr(args, "dry_run", False):
            _record_metrics(rt, args.command, result, error, rt.host.monotonic() - t0)
    return 0


def _record_metrics(rt: Any, command: str, result: Any, error: BaseException | None, duration_s: float) -> None:
    """Update the Prometheus text file ([metrics] textfile_dir); a failure is a warning, never the run's."""
    if not rt.settings.metrics.textfile_dir:
        return
    try:
        from imexctl.hooks import metrics

        run = metrics.run_of(command, result, error, duration_s, rt.settings.readiness.level)
        metrics.record(rt.settings, run, rt.host.time())
    except Exception as exc:  # metrics must never fail a hook
        rt.log.warning("metrics.failed", reason=f"{type(exc).__name__}: {exc}")


def _cmd_status(args: argparse.Namespace, rt: Any, node: str) -> int:
    from imexctl.commands import status

    data = status.collect(rt, node)
    if args.prometheus:
        from imexctl.hooks import metrics

        sys.stdout.write(metrics.render_gauges(metrics.domain_of_status(data)))
    elif args.json:
        _print_json(data)
    else:
        sys.stdout.write(status.render_text(data))
    return 0


def _cmd_container(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The job user's commands: no settings machinery, no logging set-up (they run per task)."""
    if args.command == "task-prolog":
        from imexctl.channels import taskprolog

        return taskprolog.run(env, config=args.config)
    from imexctl.channels import enroot as enroothook

    return enroothook.main(env, config=args.config)


def _cmd_doctor(args: argparse.Namespace, env: Mapping[str, str], host: Any, gpu: Any) -> int:
    """``imexctl doctor``: a broken config is one FAIL among the checks (they then use the defaults)."""
    from pathlib import Path

    import structlog

    from imexctl.config import schema, settings
    from imexctl.doctor import checks as doctor
    from imexctl.hooks.runtime import Runtime
    from imexctl.platform.errors import ConfigError, DoctorFailed
    from imexctl.platform.log import configure_logging
    from imexctl.slurm import job as slurm

    node = slurm.node_name(env, or_host=True)
    lookup = schema.as_under_slurmd(env)  # the file the hooks read under slurmd (issue 23)
    path, required = schema.find_config(args.config, lookup)
    try:
        cfg, problem = settings.load(path, node=node, required=required), ""
    except ConfigError as exc:
        cfg, problem = settings.load(None, node=node), str(exc)
    # doctor only reads: no log file, warnings on stderr
    configure_logging(level=cfg.log.level, stderr_level="info" if args.verbose else "warning")
    if host is None:
        from imexctl.platform.host import RealHost

        host = RealHost()
    if gpu is None:
        from imexctl.gpu.fabric import NvmlGpu

        gpu = NvmlGpu()
    rt = Runtime(host, gpu, cfg, structlog.get_logger())
    conf = Path(args.slurm_conf) if args.slurm_conf else None
    checks = doctor.run(doctor.Context(rt, lookup, node, conf, problem, args.nodes, args.config or ""))
    failed = [c.name for c in checks if c.status == doctor.FAIL]
    if args.json:
        _print_json(doctor.as_json(checks), errors=[DoctorFailed(f"failed: {', '.join(failed)}")] if failed else [])
    else:
        sys.stdout.write(doctor.render_text(checks))
    return doctor.exit_code(checks)


def _cmd_netcheck(args: argparse.Namespace, env: Mapping[str, str], host: Any) -> int:
    """``imexctl netcheck``: one task per tray of a job step; any user; prints and exits 1 when blocked."""
    from imexctl.commands import netcheck
    from imexctl.config import schema, settings
    from imexctl.platform.log import configure_logging
    from imexctl.slurm import job as slurm

    if env.get("SLURM_LOCALID", "0") != "0":  # one task per tray listens; others would collide
        return 0
    node = slurm.node_name(env, or_host=True)
    path, required = schema.find_config(args.config, env)
    cfg = settings.load(path, node=node, required=required)
    configure_logging(level=cfg.log.level, stderr_level="info" if args.verbose else "warning")
    if host is None:
        from imexctl.platform.host import RealHost

        host = RealHost()
    code, text = netcheck.run(netcheck.plan_from_env(env, cfg, host, max(1.0, args.timeout)))
    sys.stdout.write(text)
    return code


def _cmd_hostlist(args: argparse.Namespace) -> int:
    from imexctl.slurm import nodelist

    if args.hostlist_command == "expand":
        names = [n for expr in args.expr for n in nodelist.expand(expr)]
        sys.stdout.write("".join(f"{n}\n" for n in names))
        return 0
    names = args.names or sys.stdin.read().split()
    if names:
        sys.stdout.write(nodelist.fold(names) + "\n")
    return 0


def _cmd_topology(args: argparse.Namespace, env: Mapping[str, str], gpu: Any) -> int:
    """``imexctl topology``: needs no config and no root; NVML failing is exit 69 with a clean answer."""
    if args.topology_command == "blocks":
        return _cmd_blocks(args)
    from imexctl.gpu import topology
    from imexctl.platform.errors import GpuError
    from imexctl.slurm.job import node_name

    if gpu is None:
        from imexctl.gpu.fabric import NvmlGpu

        gpu = NvmlGpu()
    tray = topology.read_tray(gpu, args.node or node_name(env, or_host=True))
    errors = [GpuError(tray.error)] if tray.error else []
    if args.json:
        _print_json(tray.data(), errors=errors, indent=None)
    else:
        sys.stdout.write(topology.render_text(tray))
    return int(GpuError.exit_code) if errors else 0


def _cmd_blocks(args: argparse.Namespace) -> int:
    """``imexctl topology blocks``: exit 69 (after printing) when a node's report says NVML failed."""
    from imexctl.slurm import blocks

    collected = blocks.collect(_read_reports(args.files or ["-"]))
    found = blocks.group(collected)
    sizes = args.block_sizes or ()
    if args.map:
        sys.stdout.write(blocks.render_map(collected))
    elif args.yaml:
        sys.stdout.write(blocks.render_yaml(found, collected, sizes, args.topology_name))
    else:
        sys.stdout.write(blocks.render_conf(found, collected, sizes))
    notes = [] if args.map else blocks.size_warnings(found, sizes)
    if collected.no_fabric:
        fold = blocks.fold_names(collected.no_fabric)
        notes.append(f"{len(collected.no_fabric)} node(s) without multi-node NVLink fabric, in no block: {fold}")
    notes += [f"{node}: no answer, in no block: {why}" for node, why in sorted(collected.failed.items())]
    sys.stderr.write("".join(f"imexctl topology blocks: {line}\n" for line in notes))
    from imexctl.platform.errors import ExitCode

    return int(ExitCode.UNAVAILABLE) if collected.failed else 0


def _read_reports(files: Sequence[str]) -> Iterator[Any]:
    from pathlib import Path

    from imexctl.platform.errors import ReportError
    from imexctl.slurm import blocks

    for name in files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"cannot read {name}: {exc}") from exc
        for lineno, line in enumerate(text.splitlines(), 1):
            report = blocks.parse_line(line, f"{'stdin' if name == '-' else name}:{lineno}")
            if report is not None:
                yield report


def _print_cleanup(report: Any) -> None:
    """``cleanup``'s text (``results.CleanupResult.text``) on stdout."""
    sys.stdout.write(report.text())


def _print_json(data: Any, errors: Sequence[ImexctlError] = (), indent: int | None = 2) -> None:
    import json

    out = {
        "imexctl_result_version": "1",
        "status": "error" if errors else "ok",
        "exit_code": int(errors[0].exit_code) if errors else 0,
        "data": data,
        "errors": [{"code": e.code, "message": str(e)} for e in errors],
    }
    print(json.dumps(out, indent=indent))


def _open_sink(cfg: Any, args: argparse.Namespace) -> tuple[Any, str | None]:
    """The run's log sink (the log file only as root) and the problem opening the file, if any."""
    from imexctl.platform.log import open_sink

    log_file = cfg.paths.log_file if cfg and os.geteuid() == 0 else None
    syslog = bool(cfg and cfg.log.syslog == "yes")
    return open_sink(log_file=log_file, stderr_level="info" if args.verbose else "warning", syslog=syslog)


def _log_context(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Hook, job id and node for every line."""
    context: dict[str, Any] = {"hook": args.command}
    if args.command in ("prolog", "epilog"):
        # raw values, so even a failure before the job is parsed names it; the hooks rebind parsed ones
        context.update(job_id=env.get("SLURM_JOB_ID", "?"), node=env.get("SLURMD_NODENAME", "?"))
    return context


def _line_logger(sink: Any, cfg: Any, args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    from imexctl.platform.log import LineLogger

    return LineLogger(sink, cfg.log.level, _log_context(args, env))


def _configure_logging(
    cfg: Any, args: argparse.Namespace, env: Mapping[str, str], opened: tuple[Any, str | None] | None = None
) -> None:
    """Configure structlog once and bind hook, job id and node for every line."""
    import structlog

    from imexctl.platform.log import configure_structlog

    sink, problem = opened or _open_sink(cfg, args)
    configure_structlog(sink, cfg.log.level if cfg else "info")
    structlog.contextvars.bind_contextvars(**_log_context(args, env))
    if problem:
        structlog.get_logger().warning("imexctl.failed", error_code="log_file", reason=problem)


def _log_failure(exc: ImexctlError) -> None:
    import structlog

    _ensure_logging()
    structlog.get_logger().error("imexctl.failed", error_code=exc.code, exit_code=int(exc.exit_code), reason=str(exc))


def _log_crash() -> None:
    import structlog

    _ensure_logging()
    structlog.get_logger().exception("imexctl.crashed")


def _ensure_logging() -> None:
    import structlog

    if not structlog.is_configured():
        from imexctl.platform.log import configure_logging

        configure_logging()
