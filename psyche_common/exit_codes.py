"""The client's exit codes that mean something to the run-manager supervising it.

The client (client_image/cli.py) exits with these; the run-manager
(run_manager/docker_supervisor.py) decides from them whether restarting can help:
a version change restarts with the run's new image, a refusal never will (restarting
an unauthorized client only crash-loops it), any other non-zero code is a crash.
"""

from __future__ import annotations

CLIENT_EXIT_FINISHED = 0
"""The run finished (or the client was asked to stop): nothing left to do."""

CLIENT_EXIT_UNRUNNABLE = 3
"""This client cannot train the run as configured (the model does not fit)."""

CLIENT_EXIT_VERSION_MISMATCH = 10
"""The run wants another client version: Psyche's code, the run-manager pulls that one."""

CLIENT_EXIT_REFUSED = 11
"""The coordinator refused this client for good: not authorized to join, another run id,
a bad signature, another protocol. The client's last "error: ..." line says which."""
