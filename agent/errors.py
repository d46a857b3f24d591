"""Errors of the worker agent: fatal ones end the worker, the others end a task."""


class AgentError(Exception):
    """The worker cannot go on; ``str()`` is the one-line message for people.

    ``exit_code`` is what ``run_worker`` returns for it.
    """

    exit_code = 2


class Revoked(AgentError):
    """The control plane revoked this worker (or no longer accepts its session)."""

    exit_code = 3


class Unreachable(Exception):
    """The control plane did not answer (network error, timeout or a 5xx); retry."""


class Rejected(Exception):
    """The control plane answered with a 4xx error that is not fatal to the worker."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unauthorized(Rejected):
    """401: no valid token (bad join token, revoked or expired session)."""


class Forbidden(Rejected):
    """403: a valid token of the wrong kind."""


class TaskSetupError(Exception):
    """A task cannot start (unsafe bundle, bad digest, bad path); fails the task.

    ``str()`` is the reason written to the task's log and its finish.
    """


class UnsafeBundle(TaskSetupError):
    """A source bundle member would land outside the task directory or is not a plain file."""


class DigestMismatch(TaskSetupError):
    """Downloaded bytes do not hash to the digest that named them."""
