"""The launcher's failure policy: how long it waits, and what a rank's exit code means.

Introduced in notebooks/00_setup_and_launcher.ipynb. ``lk.launch`` (``_run.LaunchRun``) and the
live worlds of ``labkit.ranks`` read these numbers from here, so both stop ranks the same way.
"""

from __future__ import annotations

FAILURE_GRACE_S = 0.5  # after a first failure, wait this long for other ranks' own errors
STACK_WAIT_S = 3.0  # how long ranks get to write their stacks at a timeout
STACK_QUIET_S = 0.25  # a dump is complete once its pipe has been quiet this long
EXIT_WAIT_S = 10.0  # after its result, a rank's teardown gets this long before SIGKILL

# Exit codes a rank uses on its own; the launcher reports anything else as a crash.
EXIT_OK = 0
EXIT_RAISED = 1

# A live world (labkit.ranks.World) keeps its ranks between cells:
STOP_GRACE_S = 2.0  # a stopping rank gets this long to leave its group before SIGKILL
INTERRUPT_GRACE_S = 2.0  # after Ctrl-C, how long ranks get to abandon the cell
