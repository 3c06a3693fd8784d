"""`dslaunch`: flags -> LaunchOptions -> plan -> dry-run, check or launch.

This is the one error boundary: our typed errors become a message, a hint and a
documented exit code; a traceback appears only with --debug.
"""
from __future__ import annotations

import os
import re
import sys

import click

from launcher import __version__
from launcher.errors import EXIT_SIGINT, DslaunchError
from launcher.output_modes import MODES as OUTPUT_MODES
from launcher.planning.plan import LAUNCHERS

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _opt(*names, **kwargs):
    """An option spelled both ways: every `--a_b` also answers to `--a-b`."""
    spelled = []
    for name in names:
        spelled.append(name)
        if name.startswith("--"):
            twin = "--" + (name[2:].replace("_", "-") if "_" in name else name[2:].replace("-", "_"))
            if twin != name:
                spelled.append(twin)
    seen = list(dict.fromkeys(spelled))
    return click.option(*seen, **kwargs)


class BoundaryCommand(click.Command):
    """A click command that turns our typed errors into a message, a hint and an exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DslaunchError as exc:
            if ctx.params.get("debug") or os.environ.get("DSLAUNCH_DEBUG"):
                raise
            click.echo(f"dslaunch: {exc.kind}: {exc.message}", err=True)
            if exc.hint:
                click.echo(f"  hint: {exc.hint}", err=True)
            ctx.exit(exc.exit_code)

    def main(self, *args, **kwargs):
        """click's own usage errors in our style: `dslaunch: usage error: ...` and a hint, exit 2."""
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:  # pragma: no cover - Ctrl-C while click itself runs
            sys.exit(EXIT_SIGINT)
        except click.ClickException as exc:
            click.echo(f"dslaunch: usage error: {_one_name(exc.format_message())}", err=True)
            click.echo("  hint: dslaunch --help lists every option", err=True)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


def _one_name(message: str) -> str:
    """click names an option by all its spellings ('--num_gpus' / '--num-gpus' / ...): keep the first."""
    return re.sub(r"'(--?[\w-]+)'(?: / '--?[\w-]+')+", r"'\1'", message)


@click.command(cls=BoundaryCommand, context_settings={**CONTEXT, "allow_interspersed_args": False})
@_opt("-H", "--hostfile", "hostfile", default=None, metavar="PATH",
      help="DeepSpeed hostfile ('host slots=N' lines). Default /job/hostfile when present.")
@_opt("-i", "--include", "include", default=None, metavar="SPEC", help="Use only these hosts/slots: 'w0:0,1@w1'.")
@_opt("-e", "--exclude", "exclude", default=None, metavar="SPEC", help="Leave out these hosts/slots.")
@_opt("--num_nodes", "--nnodes", "num_nodes", type=int, default=None, help="Use the first N nodes.")
@_opt("--num_gpus", "--nproc_per_node", "--num_accelerators", "num_gpus", type=int, default=None,
      help="Use the first N slots of each node (CPU ranks when there is no GPU).")
@_opt("--master_addr", "master_addr", default=None, help="Rendezvous address (default: the first node's).")
@_opt("--master_port", "master_port", type=int, default=29500, show_default=True,
      help="Rendezvous port; 0 picks a free one on the first node.")
@_opt("--launcher", "launcher", default=None, type=click.Choice(LAUNCHERS,
      case_sensitive=False), help="How to start nodes (default: local, else pdsh if installed, else ssh).")
@_opt("--launcher_args", "launcher_args", default="", help="Extra arguments for pdsh / mpirun / srun.")
@_opt("--ssh_port", "ssh_port", type=int, default=None, help="Port for ssh and pdsh.")
@_opt("--env", "env", multiple=True, metavar="KEY=VALUE", help="Export to every rank (repeatable).")
@_opt("-m", "--module", "module", is_flag=True, help="Run SCRIPT as a module (python -m).")
@_opt("--no_python", "no_python", is_flag=True, help="Run SCRIPT as a program, not with python.")
@_opt("--no_local_rank", "no_local_rank", is_flag=True, help="Do not append --local_rank=N.")
@_opt("--as-deepspeed", "--as_deepspeed", "as_deepspeed", is_flag=True,
      help="Run a DeepSpeed script unchanged: its `import deepspeed` gets dslaunch's engine.")
@_opt("--log_dir", "--enable_each_rank_log", "log_dir", default=None, metavar="DIR",
      help="Also write DIR/rank_<R>.log on each node.")
@_opt("--output", "output", default="all", show_default=True, type=click.Choice(OUTPUT_MODES),
      help="Rank lines to show: all; rank0; failures (rank 0, and a failed rank's last lines); none.")
@_opt("--remote_python", "remote_python", default=None, help="Python on the other nodes (default: this one).")
@_opt("--workdir", "workdir", default=None, help="Working directory on every node (default: this one).")
@_opt("--heartbeat_timeout", "heartbeat_timeout", type=float, default=10.0, show_default=True,
      help="Seconds of silence after which a node counts as lost.")
@_opt("--stall_timeout", "stall_timeout", type=float, default=None, metavar="S",
      help="Name a rank that makes no progress for S seconds while the others go on, or, when no rank moves or "
           "prints for S seconds, the rank(s) outside any collective, from every rank's Python stack; then stop "
           "the job (off by default).")
@_opt("--max_restarts", "max_restarts", type=int, default=0, show_default=True,
      help="Restart the whole job after a failed rank or a lost node, up to N times.")
@_opt("--min_nodes", "min_nodes", type=int, default=None,
      help="With --max_restarts: drop a lost node and restart on the rest while at least M remain.")
@_opt("--standby_hosts", "standby_hosts", default=None, metavar="FILE",
      help="With --max_restarts: a hostfile of spares; a lost node's place goes to the next one.")
@_opt("--config", "config", default=None, metavar="PATH", help="Engine config to validate and pass on.")
@_opt("--dry-run", "--dry_run", "dry_run", is_flag=True, help="Print the plan and commands; start nothing.")
@_opt("--json", "as_json", is_flag=True, help="With --dry-run or --check: one JSON document.")
@_opt("--show-secrets", "--show_secrets", "show_secrets", is_flag=True,
      help="Print the values of secret-looking variables (*TOKEN*, *KEY*, ...) instead of <redacted>.")
@_opt("--check", "check", is_flag=True, help="Run the preflight checks only.")
@_opt("--no-preflight", "--no_ssh_check", "no_preflight", is_flag=True,
      help="Skip the checks before a multi-node launch.")
@_opt("--debug", "debug", is_flag=True, help="Show tracebacks.")
@_opt("--force_multi", "force_multi", is_flag=True, help="Start agents (ssh/pdsh) even for this machine alone.")
@_opt("--standalone", "standalone", is_flag=True, help="torchrun's: this machine only, on a free master port.")
@_opt("--node_rank", "node_rank", type=int, default=None, hidden=True)
@_opt("--tee", "tee", default=None, hidden=True)
@_opt("--redirects", "-r", "redirects", default=None, hidden=True)
@_opt("--bind_cores_to_rank", "bind_cores_to_rank", is_flag=True,
      help="DeepSpeed's: bind each rank to an even share of its node's cores (OMP_NUM_THREADS follows).")
@click.version_option(__version__, "--version", prog_name="dslaunch")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def command(**flags):
    """Start SCRIPT on every slot of every node, supervise it, tear it down on the first failure.

    \b
    dslaunch --num_gpus 2 train.py --epochs 3
    dslaunch --hostfile hosts --dry-run train.py
    dslaunch --hostfile hosts --check
    """
    from launcher.app import Mode, options_from_flags, run
    from launcher.flag_translation import translate_foreign_flags
    sys.exit(run(options_from_flags(translate_foreign_flags(flags)), Mode.from_flags(flags)))


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    command.main(args=argv, prog_name="dslaunch")
