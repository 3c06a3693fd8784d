"""Typed errors for user mistakes: each carries a message, a hint and an exit code.

The CLI is the only place that turns them into text and an exit status; nothing
below it prints or exits. Exit codes are part of the contract (docs/reference/cli.md).
"""

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
# sysexits' EX_TEMPFAIL: the job did not fail by itself, a node went away; a scheduler may retry it.
# Rare as a rank's own code, so a wrapper script can tell a lost node from a crash.
EXIT_NODE_LOST = 75
# sysexits' EX_DATAERR: training produced inf/NaN and the config said stop (non_finite.action "stop"),
# or the fp16 loss scale is stuck at its minimum; restarting the same way fails the same way.
EXIT_NON_FINITE = 65
EXIT_SIGINT = 130


class DslaunchError(Exception):
    """Base of every error a user can cause. Never shown with a traceback."""

    exit_code = EXIT_USAGE
    kind = "error"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(DslaunchError):
    """Bad or conflicting command-line options."""

    kind = "usage error"


class HostfileError(DslaunchError):
    """A hostfile that cannot be read or parsed; the message names file and line."""

    kind = "hostfile error"


class FilterError(DslaunchError):
    """A bad --include/--exclude/--num_nodes/--num_gpus request."""

    kind = "filter error"


class ConfigError(DslaunchError):
    """A bad engine config; the message names the key."""

    kind = "config error"


class EnvFileError(DslaunchError):
    """A bad line in .dslaunch_env / .deepspeed_env or a bad --env."""

    kind = "env error"


class PreflightError(DslaunchError):
    """A preflight check failed; the report says which and why."""

    kind = "preflight failed"
    exit_code = EXIT_PREFLIGHT


class LaunchError(DslaunchError):
    """The job could not be started on some node (runner missing, agent failed to start)."""

    kind = "launch error"
    exit_code = EXIT_PREFLIGHT
