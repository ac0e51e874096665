"""The run-manager's spans: the pull, the start and the stop of the client's container.

    supervisor.tracing = RunManagerTracing(telemetry.tracer)   # run_manager/cli.py

Each wraps the engine call it names, so a span lasts as long as the call and a call that
raises ends its span with status ERROR and the exception recorded (OpenTelemetry's
`start_as_current_span` does both). Spans go wherever the program's telemetry sends them
(OTLP/HTTP with --otlp-tracing-url), as the client's and the coordinator's do.

  run_manager.pull   psyche.image, psyche.pull (False: Psyche's --local, the local image
                     only), psyche.digest (set when the image was pulled)
  run_manager.start  psyche.image, psyche.version, psyche.restarts, psyche.container_id
  run_manager.stop   psyche.container_id, psyche.reason ("stop" on a stop or restart
                     request, "cleanup" when the supervisor leaves), psyche.timeout_s

Without telemetry the supervisor holds NO_TRACING, whose spans are no-ops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


class NullSpan:
    """What a span context yields without telemetry: attributes go nowhere."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None


class NoTracing:
    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        yield NullSpan()

    def pull(self, image: str, pull: bool) -> contextlib.AbstractContextManager[Any]:
        return self.span("run_manager.pull", image=image, pull=pull)

    def start(self, image: str, version: str,
              restarts: int) -> contextlib.AbstractContextManager[Any]:
        return self.span("run_manager.start", image=image, version=version, restarts=restarts)

    def stop(self, container_id: str, reason: str,
             timeout_s: float) -> contextlib.AbstractContextManager[Any]:
        return self.span("run_manager.stop", container_id=container_id, reason=reason,
                         timeout_s=timeout_s)


NO_TRACING = NoTracing()


class RunManagerTracing(NoTracing):
    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        with self.tracer.start_as_current_span(name, attributes={
                f"psyche.{key}": value for key, value in attributes.items()}) as span:
            yield span
