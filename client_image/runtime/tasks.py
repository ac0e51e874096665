"""Background tasks of the runtime, guarded: a failing task is reported, never a crash.

    tasks = GuardedTasks(on_failure=lambda name, exc: ...)
    tasks.spawn(download(...), "download-3")
    await tasks.close()            # cancel and await everything still running
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

# What starts a guarded background task (GuardedTasks.spawn), for the parts that need one.
Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class GuardedTasks:
    def __init__(self, on_failure: Callable[[str, Exception], None]):
        self.on_failure = on_failure
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(self._guard(coro, name), name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _guard(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s failed", name)
            self.on_failure(name, exc)

    async def close(self) -> None:
        running = list(self.tasks)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(BaseException):
                await task
