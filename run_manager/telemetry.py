"""The run-manager's telemetry: container starts, exits and restarts from supervisor events.

    observer = RunManagerTelemetry(telemetry)
    supervisor = Supervisor(engine, coordinator, config, observer.wrap(on_event))
    supervisor.tracing = observer.tracing  # spans of the container's pull, start and stop
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from psyche_common.telemetry.core import Telemetry
from run_manager.tracing import RunManagerTracing

log = logging.getLogger(__name__)


class RunManagerTelemetry:
    def __init__(self, telemetry: Telemetry):
        self.telemetry = telemetry
        self.tracing = RunManagerTracing(telemetry.tracer)  # the supervisor's spans
        telemetry.gauge("psyche_run_manager_container_running").set(0)

    def on_event(self, event: Any) -> None:
        """Counts a supervisor event (dispatch on the class name: no docker import here)."""
        t, kind = self.telemetry, type(event).__name__
        if kind == "ContainerStarted":
            t.counter("psyche_run_manager_container_starts").add(1)
            t.gauge("psyche_run_manager_container_running").set(1)
        elif kind == "ContainerExited":
            t.counter("psyche_run_manager_container_exits").add(
                1, {"exit_code": str(event.exit_code)})
            t.gauge("psyche_run_manager_container_running").set(0)
            t.gauge("psyche_run_manager_container_uptime_seconds").set(float(event.uptime_s))
        elif kind == "RestartScheduled":
            t.counter("psyche_run_manager_container_restarts").add(1, {"reason": event.reason})
        elif kind == "SupervisorFinished":
            t.gauge("psyche_run_manager_container_running").set(0)

    def wrap(self, on_event: Callable[[Any], None]) -> Callable[[Any], None]:
        """An on_event that counts the event, then hands it on."""
        def counted(event: Any) -> None:
            try:
                self.on_event(event)
            except Exception:  # telemetry must never break supervision
                log.warning("telemetry: counting %r failed", event, exc_info=True)
            on_event(event)
        return counted
