"""The client: wires a coordinator backend, the P2P node, the training worker and the
round runner together, and follows the coordinator until the run ends or it is stopped.

    client = PsycheClient(ClientOptions(...), EventLog("json"))
    exit_code = await client.run()

What the client does in each phase, and all the state of the rounds, is the
`RoundRunner`'s (round_runner.py); this class only moves messages: coordinator states to
the runner (after the version check and learning the peers' addresses), gossip to the
runner (decoded), and the runner's messages out through the backend and the peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from client_image.backends.base import CoordinatorBackend, ServerState
from client_image.backends.tcp import TcpBackend
from client_image.client_config import ClientConfig
from client_image.data import DataProvider
from client_image.formats.replay_settings import replay_class_of
from client_image.p2p import (
    GossipMessage,
    GossipTopic,
    ModelFetchOptions,
    NodeConfig,
    P2PNode,
    decode_broadcast,
)
from client_image.p2p.model_sharing import MEGABIT_BYTES
from client_image.runtime.evaluating import EvalOptions, IdleEvals
from client_image.runtime.event_recording import ClientEventRecorder
from client_image.runtime.events import (
    CoordinatorRefused,
    HubRepoNotRunRepository,
    RunFinished,
    Started,
    StateChanged,
    TaskFailed,
    VersionMismatch,
)
from client_image.runtime.model_keeper import REFUSED, CheckpointOptions, hub_repo_problem
from client_image.runtime.observability import Counters, EventLog, MetricsServer, snapshot
from client_image.runtime.peers import IrohPeers
from client_image.runtime.removal import RemovalWatch
from client_image.runtime.round_runner import RoundRunner, RunnerOptions
from client_image.runtime.tasks import GuardedTasks
from client_image.runtime.worker import TrainingWorker
from client_image.training.rank_group import RankSetup
from client_image.verification.settings import capture, split_over_ranks
from coordinator import CoordinatorState, NodeIdentity, RunState
from coordinator.checkpoint_reports import describe_location
from coordinator.config import ServerDataLocation
from coordinator.messages import Refusal
from psyche_common.exit_codes import CLIENT_EXIT_UNRUNNABLE, CLIENT_EXIT_VERSION_MISMATCH
from psyche_common.identity import Identity
from psyche_common.metrics_schema import ClientMetrics
from psyche_common.tcp.connection import CONNECTION_ERRORS

if TYPE_CHECKING:
    from client_image.telemetry import ClientTelemetry

log = logging.getLogger(__name__)
EXIT_VERSION_MISMATCH = CLIENT_EXIT_VERSION_MISMATCH
EXIT_UNRUNNABLE = CLIENT_EXIT_UNRUNNABLE  # the model won't fit: the run as configured
# A stop's bounds (the CLI's deadline, STOP_WITHIN_S, ends whatever is left after them):
WITHDRAW_TIMEOUT_S = 1.0  # sending Withdraw to a connected coordinator
STOP_WAIT_IDLE_S = 3.0  # the worker thread's call in progress (a checkpoint write) to end
STOP_P2P_S = 2.0  # closing the iroh endpoint
STOP_RANKS_S = 3.0  # the rank processes to exit (then they are killed)


@dataclass
class ClientOptions:
    """The client's configuration (`ClientConfig`: every `psyche-client train` option, defined
    once in client_image/client_config.py) and what the CLI resolved from it."""

    config: ClientConfig  # its training.device is a device this host has, not "auto"
    identity: Identity  # from the wallet or identity key file
    node_config: NodeConfig  # from the p2p options (bind interface, relays)
    ranks: RankSetup | None = None  # D x T > 1: several processes train this client's model
    hub_token: str | None = None  # HF_TOKEN
    client_version: str | None = None  # CLIENT_VERSION: exit 10 when the run wants another
    apply_download_timeout_s: float = 20.0
    # Benchmarks of the model while it is idle between epochs (runtime/evaluating.py): the
    # eval options with their task names parsed.
    evals: EvalOptions = field(default_factory=EvalOptions)

    def __post_init__(self) -> None:
        if self.config.training.device == "auto":  # the CLI resolves it (client_image/host.py)
            raise ValueError("ClientOptions needs a resolved device (cpu, cuda:N), not auto")

    def runner_options(self) -> RunnerOptions:
        checkpoints = self.config.checkpoints
        return RunnerOptions(
            checkpoints=CheckpointOptions(
                checkpoint_dir=checkpoints.checkpoint_dir, keep_steps=checkpoints.keep_steps,
                delete_old_steps=checkpoints.delete_old_steps, hub_repo=checkpoints.hub_repo,
                hub_token=self.hub_token, gcs_bucket=checkpoints.gcs_bucket,
                gcs_prefix=checkpoints.gcs_prefix),
            write_gradients_dir=self.config.training.write_gradients_dir,
            apply_download_timeout_s=self.apply_download_timeout_s)


def own_replay_class(device: str, rank_setup: RankSetup | None, compute: str = "fp32",
                     micro_batch_size: int = 1) -> int:
    """The replay class this client joins with (formats/replay_settings.py): of the
    settings its trainer will declare (runtime/trainer_choice.py, worker.py for a split
    model): the worker's compute dtype and micro-batch size, no pinned attention kernel,
    this process's threads and oneDNN switch, the hardware with the split over ranks. Every
    one of them enters the class, so a trainer declaring anything else fails its same-class
    followers (verification/followers.py)."""
    settings = capture(compute, micro_batch_size, device)
    if rank_setup is not None:
        settings = split_over_ranks(settings, rank_setup.dims.dp, rank_setup.dims.tp)
    return replay_class_of(settings)


def join_replay_class(choice: Literal["machine", "none"], device: str,
                      rank_setup: RankSetup | None, compute: str = "fp32",
                      micro_batch_size: int = 1) -> int:
    """The replay class sent when joining, by the client's REPLAY_CLASS option: "machine",
    its own (own_replay_class); "none", class 0, which the coordinator lists without waiting
    for clients of the same class (a rare machine may otherwise wait forever) and whose
    followers judge it with the loose limits."""
    if choice == "none":
        return 0
    return own_replay_class(device, rank_setup, compute, micro_batch_size)


class PsycheClient:
    def __init__(self, options: ClientOptions, events: EventLog):
        self.options = options
        self.events = events
        self.me = NodeIdentity(options.identity.public_key)
        upload_mbps = options.config.p2p.max_upload_mbps
        self.node = P2PNode(options.identity, options.node_config,
                            upload_bytes_per_second=None if upload_mbps is None
                            else upload_mbps * MEGABIT_BYTES)
        training = options.config.training
        self.worker = TrainingWorker(device=training.device,
                                     micro_batch_size=training.micro_batch_size,
                                     dtype=training.dtype,
                                     activation_checkpointing=training.activation_checkpointing,
                                     ranks=options.ranks,
                                     adversary=options.config.verification.test_adversary,
                                     dummy_training_delay_s=training.dummy_training_delay_secs)
        # Sent when joining: the coordinator elects followers among clients of one class;
        # REPLAY_CLASS=none joins as class 0, listed at once, judged with the loose limits.
        self.replay_class = join_replay_class(options.config.verification.replay_class,
                                              training.device, self.worker.rank_setup,
                                              self.worker.compute, self.worker.micro_batch_size)
        self.counters = Counters()
        # what the runtime tells only by event (following, ejected) reaches the metrics
        events.listeners.append(self.counters.observe)
        self.removals = RemovalWatch(self.me, events)  # tells why it was taken out
        events_dir = options.config.observability.events_dir
        self.event_files = None if events_dir is None else ClientEventRecorder(
            events_dir, self.me.key.hex(), options.config.connection.run_id, events,
            keep_files=options.config.observability.keep_event_files)
        self.state: CoordinatorState | None = None
        self.last_server_state: tuple[ServerState, float] | None = None  # (state, received at)
        self.addresses: dict[str, str] = {}
        self.exit_code: int | None = None
        self.stop_event = asyncio.Event()
        self.withdrawing = False  # on stopping, send Withdraw (stop(withdraw=True))
        self.tasks = GuardedTasks(lambda name, exc: self.events.emit(TaskFailed(
            task=name, error=repr(exc), error_type=type(exc).__name__)))
        self.topic: GossipTopic | None = None
        self.backend: CoordinatorBackend | None = None
        self.runner: RoundRunner | None = None
        self.metrics_server: MetricsServer | None = None
        self.telemetry: ClientTelemetry | None = None  # set by the CLI when exporting

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        metrics_port = self.options.config.observability.metrics_local_port
        if metrics_port is not None:  # first: a taken port starts nothing
            self.metrics_server = MetricsServer(metrics_port, self.metrics)
            await self.metrics_server.start()
        await self.node.start()
        self.topic = self.node.subscribe(self.options.config.connection.run_id)
        self.backend = self._make_backend()
        self.runner = self._make_runner(self.backend, self.topic)
        self.events.emit(Started(identity=self.me.key.hex(),
                                 p2p_address=self.node.address.to_string()))
        gossip = asyncio.create_task(self._gossip_loop(), name="gossip")
        backend = asyncio.create_task(
            self.backend.run(self._on_state, self._on_error, self.stop_event), name="backend")
        try:
            done, _ = await asyncio.wait({backend, asyncio.create_task(self.stop_event.wait())},
                                         return_when=asyncio.FIRST_COMPLETED)
            if backend in done:
                backend.result()  # re-raise BackendRejected
        finally:
            self.stop_event.set()
            if self.withdrawing:
                await self._withdraw()
            for task in [gossip, backend]:
                task.cancel()
            for task in [gossip, backend]:
                with contextlib.suppress(BaseException):
                    await task
            await self.tasks.close()
            await self.runner.close()
            # A checkpoint being written in the worker thread may finish (else it is
            # abandoned whole: staged, then renamed); so may a training step.
            await self.worker.wait_idle(STOP_WAIT_IDLE_S)
            if self.metrics_server is not None:
                await self.metrics_server.stop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.node.stop(), STOP_P2P_S)
            if self.event_files is not None:
                self.event_files.close()
            self.worker.close(ranks_timeout_s=STOP_RANKS_S)
        return self.exit_code or 0

    async def _withdraw(self) -> None:
        """Tell the coordinator this client leaves (a stop asked by a signal), when it is
        connected (the backend's `withdraw` sends only then; a Solana run has no on-chain
        withdrawal), waiting at most WITHDRAW_TIMEOUT_S: an unreachable coordinator is not
        waited for. Not between epochs: there the coordinator keeps a client that
        disconnects listed as a holder of the epoch's model (coordinator_tcp/server.py), and
        a Withdraw would undo that."""
        backend, state = self.backend, self.state
        if backend is None or state is None:
            return
        if state.run_state in (RunState.Cooldown, RunState.WaitingForMembers,
                               RunState.Finished):
            return
        with contextlib.suppress(TimeoutError, *CONNECTION_ERRORS):
            if await asyncio.wait_for(backend.withdraw(), WITHDRAW_TIMEOUT_S):
                log.info("withdrew from the run")

    def _make_backend(self) -> CoordinatorBackend:
        options, p2p_address = self.options, self.node.address.to_string()
        connection = options.config.connection
        if connection.rpc:
            from solders.keypair import Keypair
            from solders.pubkey import Pubkey

            from client_image.backends.solana import SolanaBackend, SolanaBackendOptions

            return SolanaBackend(SolanaBackendOptions(
                rpc=[connection.rpc, connection.rpc_2, connection.rpc_3],
                ws_rpc=[connection.ws_rpc, connection.ws_rpc_2, connection.ws_rpc_3],
                run_id=connection.run_id,
                wallet=Keypair.from_seed(options.identity.secret_key), p2p_address=p2p_address,
                client_version=options.client_version or "",
                replay_class=self.replay_class,
                authorizer=Pubkey.from_string(connection.authorizer)
                if connection.authorizer else None))
        if not connection.server_addr:
            raise ValueError("a client needs --server-addr (TCP run) or --rpc (Solana run)")
        return TcpBackend(connection.server_addr, options.identity, connection.run_id, p2p_address,
                          options.client_version or "", replay_class=self.replay_class)

    def _make_runner(self, backend: CoordinatorBackend, topic: GossipTopic) -> RoundRunner:
        telemetry = self.telemetry

        def model_progress(downloaded: int, total: int) -> None:
            # The metrics endpoint's (the run-manager's progress bar) and the telemetry's.
            self.counters.model_params_downloaded = downloaded
            self.counters.model_params_total = total
            if telemetry is not None:
                telemetry.model_progress(downloaded, total)

        p2p = self.options.config.p2p
        fetching = ModelFetchOptions.of_client(p2p.max_concurrent_parameter_requests,
                                               p2p.max_model_download_mbps)
        peers = IrohPeers(self.node, topic, fetching, progress=model_progress)
        return RoundRunner(self.me, backend=backend, peers=peers, worker=self.worker,
                           open_data=self._open_data, events=self.events,
                           counters=self.counters, options=self.options.runner_options(),
                           tracer=telemetry, on_unrunnable=self._unrunnable,
                           idle=IdleEvals(self.options.evals, self.worker, self.events)
                           if self.options.evals.enabled else None)

    def _unrunnable(self, reason: str) -> None:
        log.error("%s", reason)
        self.stop(EXIT_UNRUNNABLE)

    async def _open_data(self, state: CoordinatorState) -> DataProvider:
        from client_image.data import OPENABLE_LOCATIONS, TcpDataProvider, open_provider

        location = state.model.data_location
        if isinstance(location, OPENABLE_LOCATIONS):
            return await open_provider(location, state.model.max_seq_len)
        if isinstance(location, ServerDataLocation):
            return await TcpDataProvider.open(location.address, self.options.identity,
                                              state.run_id, state.model.max_seq_len)
        raise RuntimeError(f"data location {type(location).__name__} is not supported")

    def stop(self, exit_code: int = 0, *, withdraw: bool = False) -> None:
        """End `run` (with `exit_code`, unless a stop came first); `withdraw`: tell the
        coordinator this client leaves (a signal's stop), if it can be told at once."""
        if self.exit_code is None:
            self.exit_code = exit_code
        self.withdrawing = self.withdrawing or withdraw
        self.stop_event.set()

    def metrics(self) -> ClientMetrics:
        return snapshot(self.counters, self.options.client_version or "", self.node, self.topic)

    # ------------------------------------------------------------------ coordinator state
    def _on_error(self, reply: Refusal) -> None:
        self.events.emit(CoordinatorRefused(error=reply.error, detail=reply.detail))

    async def _on_state(self, server_state: ServerState) -> None:
        state, previous = server_state.state, self.state
        self.state = state
        self.last_server_state = (server_state, time.monotonic())
        self.addresses = server_state.p2p_addresses
        self._learn_peers(state)
        wanted = state.client_version
        mine = self.options.client_version
        if mine and wanted not in (mine, "test"):
            self.events.emit(VersionMismatch(wanted=wanted, running=mine))
            self.stop(EXIT_VERSION_MISMATCH)
            return
        if previous is None:
            self._check_hub_repo(state)
        self.removals.notice(state)
        self.counters.phase, self.counters.epoch = state.run_state.name, state.progress.epoch
        self.counters.step = state.progress.step
        changed = (previous is None or previous.run_state != state.run_state
                   or previous.progress.step != state.progress.step
                   or previous.progress.epoch != state.progress.epoch)
        if not changed:
            return
        self.events.emit(StateChanged(phase=state.run_state.name, epoch=state.progress.epoch,
                                      step=state.progress.step,
                                      clients=len(state.epoch_state.clients)))
        if state.run_state is RunState.Finished:
            self.tasks.spawn(self._finish(), "finish")
            return
        assert self.runner is not None
        self.runner.on_state(state, previous)

    def _check_hub_repo(self, state: CoordinatorState) -> None:
        """Warn once, at the first state, when the reports of our uploads will be refused:
        the run's repository is its authority's, not whatever --hub-repo names."""
        hub_repo = self.options.config.checkpoints.hub_repo
        problem = hub_repo_problem(hub_repo, state.model.checkpoint)
        if hub_repo and problem is not None:
            self.events.emit(HubRepoNotRunRepository(
                hub_repo=hub_repo, run_checkpoint=describe_location(state.model.checkpoint),
                error=REFUSED.name, detail=f"the coordinator will refuse this client's "
                f"checkpoint reports (uploads still go to --hub-repo): {problem}"))

    def _learn_peers(self, state: CoordinatorState) -> None:
        known = []
        for client in state.epoch_state.clients:
            key = client.id.key.hex()
            if client.id != self.me and key in self.addresses:
                known.append(self.addresses[key])
        if known and self.topic is not None:
            try:
                self.topic.add_peers(self.node.add_peer_addresses(known))
            except ValueError as exc:
                log.warning("bad peer address from the coordinator: %s", exc)

    async def _finish(self) -> None:
        if self.runner is not None:
            await self.runner.settle()
        self.events.emit(RunFinished(step=self.state.progress.step if self.state else 0))
        self.stop(0)

    # ------------------------------------------------------------------ gossip
    async def _gossip_loop(self) -> None:
        assert self.topic is not None
        async for message in self.topic.messages():
            self.counters.broadcasts_seen += 1
            try:
                self._handle_gossip(message)
            except Exception:
                log.exception("gossip message handling failed")

    def _handle_gossip(self, message: GossipMessage) -> None:
        try:
            broadcast = decode_broadcast(message.payload)
        except ValueError as exc:
            self.counters.apply_message_failure += 1
            log.warning("malformed broadcast from %s: %s", message.sender.hex()[:12], exc)
            return
        assert self.runner is not None
        self.runner.on_broadcast(message.sender, broadcast)
