"""`psyche-testnet`: a whole local run on this machine, the coordinator and N clients as processes.

    psyche-testnet --num-clients 3 --config-path config/local-testnet --headless

starts `psyche-coordinator run` (with the config's data.toml when present) and N
`psyche-client train` processes (client i: `RAW_IDENTITY_SECRET_KEY` = i in 64 hex
digits, metrics on 127.0.0.1:6269+i, checkpoints in WORK/client-i/checkpoints, JSON logs
in WORK/client-i.log). Every process runs from the repository root, so a relative Hub
`repo_id` such as `assets/tiny-llama` resolves there.

The run is watched through a read-only *observer* connection (`Join.observe`): it gets
every state broadcast but is never offered to the coordinator as a client. Random kills
SIGKILL `--random-kill-num` of the `--allowed-to-kill` clients every
`--random-kill-interval` seconds and restart them at once. `--headless` waits for
Finished (or `--timeout`) and prints ONE JSON line: first_loss, last_loss, steps,
epochs, clients_identical (SHA-256 of the final checkpoints' safetensors of the clients
that reached the last one), killed, rejoined, wall_s (+ finished, final_step, error).
`--tui` shows the server and each client's metrics instead.

Stopping leaves nothing behind: every process runs in a session (so a process group) of
its own, and `stop()` ends each whole group — SIGTERM to the process (it stops its own
children), SIGKILL to the group after `STOP_GRACE_S` (at once after `hurry()`), then
SIGTERM and SIGKILL to anything of the group that outlived it (a client's ranks) — the
clients first, then the coordinator (which saves its state). A watchdog process
(`local_testnet/watchdog.py`) holds the list of groups and ends them if this process dies
without stopping them (SIGKILL included).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_image.runtime.rounds import trains_this_round
from coordinator import (
    ClientState,
    CoordinatorState,
    RunState,
    StateDecodeError,
    assign_data_for_state,
    decode_state,
)
from coordinator.config import (
    ConfigError,
    ServerDataLocation,
    StateFile,
    load_data_config,
    load_state_file,
)
from local_testnet.client_log import log_path, parse_event
from local_testnet.model_resets import ModelResets, checkpoint_finder
from local_testnet.ports import pick_metrics_ports
from local_testnet.watchdog import group_alive, signal_group
from psyche_common.identity import Identity
from psyche_common.stopping import StopSignals, say

REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 10.0  # SIGTERM, then this long before SIGKILL
_GROUP_GONE_S = 3.0  # after its leader, how long a group's other processes may take to go


def client_secret_hex(i: int) -> str:
    return f"{i:064x}"


def client_key(i: int) -> bytes:
    return Identity.from_hex(client_secret_hex(i)).public_key


def _script(name: str, module: str) -> list[str]:
    """The console script next to this interpreter, else the module through it."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return [str(candidate)]
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; "
            f"from {module} import main; main()"]


@dataclass
class TestnetOptions:
    __test__ = False  # not a pytest test class, despite the name
    num_clients: int
    config_path: Path
    work_dir: Path
    server_port: int = 20000
    random_kill_num: int = 0
    random_kill_interval_s: float = 120.0
    allowed_to_kill: list[int] = field(default_factory=list)
    late_join_client_delay_s: float = 0.0
    timeout_s: float = 1800.0
    root: Path = REPO_ROOT
    data_port: int | None = None  # rewrite the Server data location's port
    # client i serves metrics on base + i; None: from 6269 if free, else free ports
    metrics_base_port: int | None = None
    server_args: list[str] = field(default_factory=list)  # extra `psyche-coordinator run` flags
    client_args: list[str] = field(default_factory=list)  # extra `psyche-client train` flags
    client_args_of: dict[int, list[str]] = field(default_factory=dict)  # more, for client i


@dataclass
class ClientProcess:
    index: int
    process: asyncio.subprocess.Process | None = None
    losses: dict[int, float] = field(default_factory=dict)
    awaiting_rejoin: str | None = None  # None | "killed" | "out"
    last_line: str = ""  # its last log line (the TUI shows it in words: describe_line)


def fit_to_clients(state: StateFile, num_clients: int) -> list[tuple[str, int, int]]:
    """(name, was, now) of the [config] values to lower so that a run of `num_clients`
    clients starts: init_min_clients and min_clients at most the clients, witness_nodes at
    most min_clients (the config's own rule)."""
    config = state.config
    return [(name, getattr(config, name), num_clients)
            for name in ("init_min_clients", "min_clients", "witness_nodes")
            if getattr(config, name) > num_clients]


class Testnet:
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, options: TestnetOptions):
        self.options = options
        options.work_dir.mkdir(parents=True, exist_ok=True)
        self.state_path = options.config_path / "state.toml"
        self.state_file = load_state_file(self.state_path)
        location = self.state_file.model.data_location
        rewrite = False
        if options.data_port is not None and isinstance(location, ServerDataLocation):
            host = location.address.rpartition(":")[0]
            model = self.state_file.model.model_copy(update={
                "data_location": ServerDataLocation(address=f"{host}:{options.data_port}")})
            self.state_file = self.state_file.model_copy(update={"model": model})
            rewrite = True
        # A run that waits for more clients than the testnet starts would wait forever.
        self.fitted = fit_to_clients(self.state_file, options.num_clients)
        if self.fitted:
            config = self.state_file.config.model_copy(
                update={name: now for name, _, now in self.fitted})
            self.state_file = self.state_file.model_copy(update={"config": config})
            rewrite = True
        if rewrite:
            self.state_path = options.work_dir / "state.toml"
            self.state_path.write_text(self.state_file.to_toml())
            load_state_file(self.state_path)  # still a valid config
        data_toml = options.config_path / "data.toml"
        self.data_config_path = data_toml if data_toml.exists() else None
        if self.data_config_path is not None:
            load_data_config(self.data_config_path)  # fail early, with the config's messages
        location = self.state_file.model.data_location
        if isinstance(location, ServerDataLocation) and \
                location.address.endswith(f":{options.server_port}"):
            raise ConfigError([f"--server-port {options.server_port} is also the data "
                               f"server's port ({location.address})"])
        self.metrics_ports = pick_metrics_ports(options.metrics_base_port, options.num_clients)
        self.run_id = self.state_file.run_id
        self.server: asyncio.subprocess.Process | None = None
        self.clients = {i: ClientProcess(i) for i in range(1, options.num_clients + 1)}
        self._client_keys = {i: client_key(i) for i in self.clients}
        self.state: CoordinatorState | None = None
        # What the last state update also said: the clients connected and asking to take
        # part (None: not said), and the server's unix time then, with our monotonic time.
        self.joined: int | None = None
        self.server_time = 0
        self.state_received = 0.0
        self.killed = 0
        self.rejoined = 0
        # epochs started from the stored checkpoint although the clients held a newer model
        self.model_resets = ModelResets(checkpoint_finder(options.work_dir, self.run_id))
        # step -> whether its round had batches to train (the clients' rule: a batch
        # assigned, and not one of an epoch's last two apply-only rounds)
        self.trainable: dict[int, bool] = {}
        # called with every state the observer receives (tests act on exact phases)
        self.state_listeners: list[Callable[[CoordinatorState], None]] = []
        self.started = time.monotonic()
        self._tasks: list[asyncio.Task[Any]] = []
        self._watchdog: asyncio.subprocess.Process | None = None
        self._hurry = asyncio.Event()  # stop(): SIGKILL at once, no grace
        self.stop_signal: signal.Signals | None = None  # what stopped it (exit 128 + it)

    # ------------------------------------------------------------------ watchdog
    async def _start_watchdog(self) -> None:
        try:
            self._watchdog = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).with_name("watchdog.py")), str(STOP_GRACE_S),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:  # the run can go on; only a SIGKILLed testnet leaks then
            say(f"warning: no watchdog for the testnet's processes: {exc}")

    def _tell_watchdog(self, line: str) -> None:
        watchdog = self._watchdog
        if watchdog is not None and watchdog.stdin is not None and watchdog.returncode is None:
            with contextlib.suppress(OSError, RuntimeError):
                watchdog.stdin.write(f"{line}\n".encode())

    async def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        if watchdog.stdin is not None:
            watchdog.stdin.close()  # EOF: every group it knows was stopped, so it just exits
        try:
            await asyncio.wait_for(watchdog.wait(), STOP_GRACE_S + 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                watchdog.kill()
            await watchdog.wait()

    # ------------------------------------------------------------------ processes
    async def _spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None,
                     on_line: Any = None) -> asyncio.subprocess.Process:
        if self._watchdog is None:  # (again after a stop(): a testnet may be restarted)
            await self._start_watchdog()
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=self.options.root, env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, limit=2**22)
        self._tell_watchdog(f"+{process.pid}")  # its own session: pgid == pid
        self._tasks.append(asyncio.create_task(self._pump(process, log_name, on_line)))
        return process

    async def _pump(self, process: asyncio.subprocess.Process, log_name: str,
                    on_line: Any) -> None:
        assert process.stdout is not None
        with (self.options.work_dir / log_name).open("ab") as log:
            async for raw in process.stdout:
                log.write(raw)
                log.flush()
                if on_line is not None:
                    on_line(raw.decode(errors="replace").rstrip())
        # End of output: the process (and, mostly, its group) is gone.
        await process.wait()
        if not group_alive(process.pid):
            self._tell_watchdog(f"-{process.pid}")

    async def start_server(self) -> None:
        argv = [*_script("psyche-coordinator", "coordinator_tcp.cli"), "run",
                "--state", str(self.state_path.resolve()),
                "--server-port", str(self.options.server_port), "--bind-host", "127.0.0.1",
                "--save-state-dir", str(self.options.work_dir / "server-state")]
        if self.data_config_path is not None:
            argv += ["--data-config", str(self.data_config_path.resolve())]
        self.server = await self._spawn([*argv, *self.options.server_args], "server.log")

    async def start_client(self, i: int) -> None:
        client = self.clients[i]
        checkpoints = self.options.work_dir / f"client-{i}" / "checkpoints"
        checkpoints.mkdir(parents=True, exist_ok=True)
        argv = [*_script("psyche-client", "client_image.cli"), "train",
                "--run-id", self.run_id, "--server-addr", f"127.0.0.1:{self.options.server_port}",
                "--bind-p2p-port", "0", "--iroh-relay", "disabled", "--device", "cpu",
                "--checkpoint-dir", str(checkpoints), "--logs", "json",
                "--metrics-local-port", str(self.metrics_ports.ports[i]),
                # N clients share this machine's cores: one torch thread each avoids
                # oversubscription (a client's own --torch-threads in client_args wins).
                "--torch-threads", "1", *self.options.client_args,
                *self.options.client_args_of.get(i, [])]
        client.process = await self._spawn(argv, log_path(Path(), i).name,
                                           {"RAW_IDENTITY_SECRET_KEY": client_secret_hex(i)},
                                           lambda line: self._client_line(client, line))

    def _client_line(self, client: ClientProcess, line: str) -> None:
        client.last_line = line[:4000]  # whole (but bounded): a JSON event still parses
        event = parse_event(line)
        if event is not None and event["event"] == "trained":
            step, loss = event.get("step"), event.get("loss")
            if isinstance(step, int) and isinstance(loss, int | float):
                client.losses[step] = float(loss)

    def hurry(self) -> None:
        """Make a `stop()` (running or to come) kill at once instead of waiting."""
        self._hurry.set()

    def stopping(self, reason: str, count: int = 1) -> None:
        """A stop was asked for (a signal, a key): say so on stderr, hurry on the second."""
        if self.stop_signal is None and reason.startswith("SIG"):
            self.stop_signal = signal.Signals[reason]
        if count > 1:
            self.hurry()
            say(f"stopping now ({reason} again): killing what is left")
            return
        say(f"stopping… ({reason}): the clients, then the coordinator")

    async def _terminate(self, process: asyncio.subprocess.Process | None,
                         grace_s: float = STOP_GRACE_S) -> None:
        """End `process` and everything in its process group: SIGTERM to it (it stops its
        own children in order), SIGKILL to the group after `grace_s` (at once on `hurry()`),
        then whatever of the group outlived it (a client's ranks): SIGTERM, SIGKILL."""
        if process is None:
            return
        pgid = process.pid  # started in a session of its own
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            wait = asyncio.create_task(process.wait())
            hurry = asyncio.create_task(self._hurry.wait())
            await asyncio.wait({wait, hurry}, timeout=grace_s,
                               return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
            if not wait.done():
                signal_group(pgid, signal.SIGKILL)
            await wait
        if group_alive(pgid):
            signal_group(pgid, signal.SIGKILL if self._hurry.is_set() else signal.SIGTERM)
            if not await _group_gone(pgid, _GROUP_GONE_S / 2):
                signal_group(pgid, signal.SIGKILL)
                await _group_gone(pgid, _GROUP_GONE_S / 2)
        self._tell_watchdog(f"-{pgid}")

    async def stop(self) -> None:
        """Stop every process this testnet started (whole process groups), the clients
        first (the coordinator still answers them), then the coordinator. Bounded:
        STOP_GRACE_S, then SIGKILL."""
        helpers = [t for t in self._tasks if t.get_name().startswith("testnet-")]
        for task in helpers:  # no random kill or late join may start a client now
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await asyncio.gather(*(self._terminate(c.process) for c in self.clients.values()))
        await self._terminate(self.server)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_watchdog()

    # ------------------------------------------------------------------ watching
    async def watch(self) -> None:
        """Keep `self.state` current through an observer connection (reconnecting)."""
        from coordinator_tcp.client import ProtocolConnection
        from coordinator_tcp.protocol import StateUpdate
        from psyche_common.tcp.connection import Backoff, keep_connected

        observer = Identity.generate()

        async def observe() -> None:
            connection, _ = await ProtocolConnection.connect(
                "127.0.0.1", self.options.server_port, observer, self.run_id,
                observe=True, timeout_s=5)
            try:
                while True:
                    message = await connection.receive()
                    if isinstance(message, StateUpdate):
                        with contextlib.suppress(StateDecodeError, ValueError):
                            self.state = decode_state(message.state_bytes)
                            self.joined, self.server_time = message.joined, message.server_time
                            self.state_received = time.monotonic()
                            self._track_rejoins(self.state)
                            self._track_rounds(self.state)
                            self.model_resets.observe(self.state, self._client_keys)
                            for listener in list(self.state_listeners):
                                listener(self.state)
            finally:
                await connection.close()

        # Not listening yet, or restarting: try again every half second.
        await keep_connected(observe, stop=asyncio.Event(),
                             backoff=Backoff(first_s=0.5, max_s=0.5, jitter=0.0))

    def _track_rejoins(self, state: CoordinatorState) -> None:
        healthy = {c.id.key for c in state.epoch_state.clients if c.state is ClientState.Healthy}
        for i, client in self.clients.items():
            if client.awaiting_rejoin is None:
                continue
            if client_key(i) not in healthy:
                client.awaiting_rejoin = "out"
            elif client.awaiting_rejoin == "out":
                client.awaiting_rejoin = None
                self.rejoined += 1

    def _track_rounds(self, state: CoordinatorState) -> None:
        if state.run_state is RunState.RoundTrain:
            step, last = state.progress.step, state.epoch_state.last_step
            has_batches = bool(assign_data_for_state(state))
            self.trainable.setdefault(step, has_batches and trains_this_round(step, last))

    def untrained_steps(self) -> list[int]:
        """Steps whose round had batches to train that no client reported training: a
        step counted with its data skipped (what must never happen)."""
        trained = {step for client in self.clients.values() for step in client.losses}
        return sorted(step for step, has in self.trainable.items() if has and step not in trained)

    async def random_kills(self) -> None:
        options = self.options
        allowed = [i for i in options.allowed_to_kill if i in self.clients] or list(self.clients)
        rng = random.Random()
        while True:
            await asyncio.sleep(options.random_kill_interval_s)
            for i in rng.sample(allowed, min(options.random_kill_num, len(allowed))):
                client = self.clients[i]
                if client.process is not None and client.process.returncode is None:
                    signal_group(client.process.pid, signal.SIGKILL)
                    await client.process.wait()
                    self._tell_watchdog(f"-{client.process.pid}")
                self.killed += 1
                self.model_resets.killed(i)
                client.awaiting_rejoin = "killed"
                await self.start_client(i)

    async def start(self) -> None:
        await self.start_server()
        self._tasks.append(asyncio.create_task(self.watch()))
        late = self.options.late_join_client_delay_s > 0 and len(self.clients) > 1
        for i in self.clients:
            if not (late and i == len(self.clients)):
                await self.start_client(i)
        if late:
            async def late_join() -> None:
                await asyncio.sleep(self.options.late_join_client_delay_s)
                await self.start_client(len(self.clients))
            self._tasks.append(asyncio.create_task(late_join(), name="testnet-late-join"))
        if self.options.random_kill_num > 0:
            self._tasks.append(asyncio.create_task(self.random_kills(),
                                                   name="testnet-random-kills"))

    def client_that_failed(self) -> str | None:
        """A line for the first client that exited on its own with an error code (a taken
        port, a bad argument, a refusal, a crash): nothing restarts it, so the run ends at
        once naming it instead of at its timeout with the others waiting. A client this
        testnet killed has a negative code (the signal) and is restarted by whoever killed it."""
        for i, client in self.clients.items():
            code = client.process.returncode if client.process is not None else None
            if code is not None and code > 0:
                return f"client-{i} exited with code {code}: {client.last_line}"
        return None

    @property
    def finished(self) -> bool:
        return self.state is not None and self.state.run_state is RunState.Finished

    # ------------------------------------------------------------------ results
    def summary(self, error: str | None = None) -> dict[str, Any]:
        by_step: dict[int, list[float]] = {}
        for client in self.clients.values():
            for step, loss in client.losses.items():
                by_step.setdefault(step, []).append(loss)
        steps = sorted(by_step)

        def mean(step: int) -> float:
            return sum(by_step[step]) / len(by_step[step])

        identical, checked = checkpoints_identical(self.options.work_dir, self.run_id,
                                                   list(self.clients))
        return {
            "first_loss": mean(steps[0]) if steps else None,
            "last_loss": mean(steps[-1]) if steps else None,
            "steps": len(steps),
            "epochs": self.state.progress.epoch if self.state else 0,
            "clients_identical": identical,
            "killed": self.killed,
            "rejoined": self.rejoined,
            "wall_s": round(time.monotonic() - self.started, 1),
            "finished": self.finished,
            "final_step": self.state.progress.step if self.state else 0,
            # where a run that timed out stood (None: the observer never got a state)
            "run_state": self.state.run_state.name if self.state else None,
            "checkpoints_compared": checked,
            # epochs that went back to the stored checkpoint (the run's initial model unless
            # an upload moved it), throwing away the training applied since; and those of
            # them while a client that held the newer model was alive (must be 0)
            "models_reset": self.model_resets.count,
            "models_reset_with_holder": self.model_resets.with_holder,
            # the coordinator's own count (CoordinatorState.model_resets)
            "coordinator_model_resets": self.state.model_resets if self.state else 0,
            # the run waits for a holder of its newer model or an operator's decision
            "coordinator_model_lost": self.state.model_lost if self.state else False,
            "error": error,
        }


async def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait (bounded) until no process of group `pgid` is alive."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


_STEP_DIR = re.compile(r"-step(\d+)$")


def checkpoints_identical(work_dir: Path, run_id: str, clients: list[int]) -> tuple[bool, int]:
    """(all equal, how many compared): SHA-256 over each client's newest checkpoint's
    safetensors files, among the clients whose newest step is the overall newest."""
    newest: dict[int, tuple[int, Path]] = {}
    for i in clients:
        root = work_dir / f"client-{i}" / "checkpoints"
        found = [(int(m.group(1)), d) for d in root.glob(f"{run_id}-step*")
                 if d.is_dir() and (m := _STEP_DIR.search(d.name))] if root.exists() else []
        if found:
            newest[i] = max(found)
    if not newest:
        return False, 0
    last = max(step for step, _ in newest.values())
    digests = set()
    compared = 0
    for _step, directory in (v for v in newest.values() if v[0] == last):
        digest = hashlib.sha256()
        files = sorted(directory.glob("*.safetensors"))
        for file in files:
            digest.update(file.name.encode() + file.read_bytes())
        if files:
            digests.add(digest.hexdigest())
            compared += 1
    return compared > 0 and len(digests) == 1, compared


async def run_headless(testnet: Testnet) -> dict[str, Any]:
    """Run until Finished, `--timeout`, the coordinator's exit, or SIGINT/SIGTERM/SIGHUP
    (`testnet.stop_signal`; a second one kills at once); always stops every process."""
    error = None
    signals = StopSignals()
    signals.on_signal(lambda sig: testnet.stopping(sig.name, signals.count))
    signals.install()
    try:
        await testnet.start()
        deadline = time.monotonic() + testnet.options.timeout_s
        while not testnet.finished:
            if signals.signal is not None:
                error = f"stopped by {signals.signal.name}"
                break
            if time.monotonic() > deadline:
                error = f"timeout after {testnet.options.timeout_s:.0f} s"
                break
            if testnet.server is not None and testnet.server.returncode is not None:
                error = f"the coordinator exited with code {testnet.server.returncode}"
                break
            if (error := testnet.client_that_failed()) is not None:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signals.event.wait(), 0.5)
        if error is None:  # let clients finish writing their last checkpoint
            clients = [c.process for c in testnet.clients.values() if c.process is not None]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in clients)), 15)
    finally:
        await testnet.stop()
        signals.remove()
    return testnet.summary(error)
