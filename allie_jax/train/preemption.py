"""Preemption: every process stops at the same step, saves it, and exits "preempted, resumable".

A scheduler preempts a pod by sending SIGTERM to each host, not at the same instant. If every
process kept its own flag, host A would stop at step 41 and wait in the checkpoint barrier while
host B runs step 42's collectives: a deadlock. With several processes we use JAX's preemption
sync service instead: the coordination service spreads the first host's notice to all, they agree
on one step (the largest step any host has reached, plus one), and
``multihost_utils.reached_preemption_sync_point(step)`` turns True at that step on every host.
Its SIGTERM handler lives in the runtime, so we must not install a Python one over it.

With one process there is nothing to agree on; a Python SIGTERM handler sets a flag. Several
processes without the sync never get this far: ``distributed.require_preemption_sync`` refuses
them at start.
"""

from __future__ import annotations

import signal

from jax.experimental import multihost_utils

from allie_jax.train.distributed import preemption_sync_available

# EX_TEMPFAIL from sysexits.h: "temporary failure, the user is invited to retry". A scheduler
# tells a preempted run (relaunch it: it resumes from the step it saved) from a finished one (0)
# and from a failure (1).
EXIT_PREEMPTED = 75


class PreemptionWatch:
    """``reached(step)`` is True at the same step on every process once any got SIGTERM.

    Call ``reached`` exactly once per step, with the same step on every process (the sync
    protocol counts calls). Use as a context manager so the old SIGTERM handler comes back.
    """

    def __init__(self) -> None:
        # The sync needs the service running, not only jax.distributed: with the service off,
        # reached() could never turn True and no handler would catch SIGTERM.
        self.synced = preemption_sync_available()
        self._flag = False
        self._previous = None
        if not self.synced:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        del signum, frame
        self._flag = True

    def reached(self, step: int) -> bool:
        if self.synced:
            try:
                return bool(multihost_utils.reached_preemption_sync_point(int(step)))
            except RuntimeError:  # the service is disabled (jax_enable_preemption_service=False)
                return False
        return self._flag

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def __enter__(self) -> PreemptionWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
