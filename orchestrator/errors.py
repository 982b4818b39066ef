"""The exception tree. Every error a user can meet derives from `SweepToolError` and carries the exit
code the CLI returns for it; the CLI maps by class and prints one message, never a traceback.

Expected trial failures are values (`records.TrialOutcome`), not exceptions: these are for the edges.
"""

from __future__ import annotations


class SweepToolError(Exception):
    """A problem the tool explains in one message (what, where, how to fix)."""

    exit_code: int = 1


class UserError(SweepToolError):
    """Anything the user can fix by changing a file or an argument: exit code 2."""

    exit_code = 2


class SpecError(UserError):
    """An experiment or search-space file breaks a rule; the message names the field, rule and fix."""


class SweepError(UserError):
    """The sweep cannot start or continue as asked (work directory in use, nothing to resume, ...)."""


class StorageError(UserError):
    """The Optuna storage cannot be opened or read."""


class StorageWriteError(StorageError):
    """The Optuna storage failed while the sweep ran (a full disk, a locked or damaged database, a lost
    server): exit code 1, an environment failure; what was measured is kept and --resume continues."""

    exit_code = 1


class StateFileError(SweepError):
    """A state file of the work directory (sweep.json, experiment.json, ray-processes.json, ...) is
    unreadable or in the way; the message names it and how to fix it."""


class ClusterUnreachable(UserError):
    """The Ray cluster named by --ray-address cannot be reached or lacks the GPUs a trial needs."""


class RayStartError(ClusterUnreachable):
    """The private Ray instance did not start (its start-up timed out, no space or memory for it): exit code 1;
    the start counts as failed, so the same command works again once the cause is gone."""

    exit_code = 1


class NoChampion(SweepToolError):
    """The sweep finished but promoted nothing (not better, undecided, no feasible trial): exit code 3,
    so a script can tell "nothing to deploy" from a failure (1) and a mistake (2)."""

    exit_code = 3


class TrackingError(SweepToolError):
    """MLflow refused a request in a way no retry fixes (exit code 1); outages queue in the outbox instead."""
