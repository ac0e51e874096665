"""The small interfaces the round runner drives: nothing else reaches it.

    CoordinatorLink   what the client tells the coordinator: the typed port of a backend
                      (TCP or Solana), domain messages of `coordinator.messages`
    Peers             the P2P side: gossip a broadcast, publish and download results,
                      fetch and share the model (iroh in production: peers.IrohPeers)
    Worker            the model and DisTrO trainer, off the event loop (worker.TrainingWorker)
    DataSource        the run's training samples (client_image.data providers)
    PhaseTracer       a span per phase when telemetry is on
    IdleWork          work for the model's idle time between epochs (evaluating.IdleEvals)

Unit tests drive the runner with in-memory fakes of all of them (tests/client_runtime).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from client_image.backends.base import CoordinatorPort
from client_image.p2p import Finished, ResultAnnouncement
from client_image.training import TrainStepOutput
from client_image.verification.followers import Checked
from coordinator import CoordinatorState
from coordinator.config import LLMConfig

Broadcast = Finished | ResultAnnouncement


CoordinatorLink = CoordinatorPort


class ModelUnavailable(RuntimeError):
    """No source can give this client the run's current model."""


class ModelFetchFailed(ModelUnavailable):
    """Peers were asked for the model and the download failed (telemetry counts these as
    `psyche_p2p_params_download_failed_counter`)."""


class Unrunnable(RuntimeError):
    """This client can never train this run as configured (the model does not fit its
    devices): retrying is pointless, the client stops with the message."""


@dataclass(frozen=True)
class FetchedModel:
    config_json: str
    tokenizer_json: str | None
    state_dict: dict[str, torch.Tensor]
    peers: int
    bytes: int


class Peers(Protocol):
    async def broadcast(self, message: Broadcast) -> None: ...

    def publish_result(self, step: int, payload: bytes) -> bytes:
        """Serve `payload` as a blob; returns its hash."""
        ...

    async def download_result(self, blob_hash: bytes, size: int, sender: bytes, step: int,
                              also_from: Sequence[bytes] = ()) -> bytes:
        """The blob from `sender`, or from `also_from` (peers that may have downloaded it:
        the producer may have died since announcing it); kept to serve others."""
        ...

    def forget_results_before(self, step: int) -> None: ...

    async def fetch_model(self, sources: Sequence[bytes], step: int) -> FetchedModel:
        """The model at coordinator step `step` from any of `sources`; ModelUnavailable
        if none of them serves it."""
        ...

    def share_model(self, weights: dict[str, torch.Tensor], config_json: str,
                    tokenizer_json: str | None, step: int) -> None: ...

    def announce_loading(self, step: int, total_bytes: int) -> None:
        """Tell fetchers we are loading the model of `step` (`total_bytes` of weights), so
        they wait for us as its size allows; `share_model` ends it."""
        ...


class Worker(Protocol):
    @property
    def loaded(self) -> bool: ...

    async def load_from_hub(self, repo_id: str, revision: str | None, llm: LLMConfig,
                            start_step: int) -> None: ...

    async def load_from_peers(self, config_json: str, tokenizer_json: str | None,
                              state_dict: dict[str, torch.Tensor], llm: LLMConfig,
                              start_step: int) -> None: ...

    async def load_dummy(self, repo_id: str, llm: LLMConfig, start_step: int) -> None: ...

    async def train(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
                    cold_start: bool) -> TrainStepOutput: ...

    async def decode(self, payload: bytes) -> object:
        """Validate a peer's payload against our model; raises on garbage."""
        ...

    async def apply(self, step: int, payloads: Sequence[bytes]) -> int: ...

    async def screen(self, of_step: int, results: Sequence[tuple[bytes, bytes]],
                     previous: Mapping[bytes, bytes]) -> dict[int, tuple[str, str]]:
        """The cheap checks on a step's consensus results ((sender, payload) in batch
        order) against each sender's `previous` result: position -> (check, detail) of
        each one to leave out. A pure function of its inputs: every client leaves out the
        same ones."""
        ...

    async def idle(self, step: int) -> None:
        """A round others train and this client does not: the weights change as theirs
        do outside of the results (weight decay), or this client drifts from them."""

    async def reset_delta(self) -> None:
        """Zero the DisTrO delta: with verification on, every epoch starts from zero so
        that followers can replay this client."""
        ...

    async def follow(self, trainers: Sequence[bytes], start_step: int,
                     joined_classes: Mapping[bytes, int] | None = None) -> bool:
        """Keep a shadow of each of `trainers` this epoch; False if this client cannot.
        `joined_classes`: those of this client's replay class, with it (followers.py)."""
        ...

    async def replay(self, trainer: bytes, step: int, batch: torch.Tensor,
                     batch_id: tuple[int, int], cold_start: bool) -> None:
        """Compute what `trainer` should publish for `batch` (after apply, before train)."""
        ...

    async def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        """Compare `trainer`'s published result of `step` with the replay; None if this
        client did not replay it."""
        ...

    async def round_to_bf16(self) -> None:
        """Round the weights kept in memory to bf16 (Psyche's cooldown), in place."""
        ...

    async def save_checkpoint(self, checkpoint_dir: Path, run_id: str, step: int,
                              keep_steps: int) -> Path: ...

    async def sharing_payload(self) -> tuple[dict[str, torch.Tensor], str, str | None]:
        """bf16 copies of the weights, the config JSON and the tokenizer JSON, for joiners."""
        ...


class DataSource(Protocol):
    async def fetch(self, start: int, end: int) -> torch.Tensor: ...


class DataOpener(Protocol):
    async def __call__(self, state: CoordinatorState) -> DataSource: ...


class PhaseTracer(Protocol):
    def phase(self, name: str, state: CoordinatorState) -> AbstractContextManager[object]: ...


class IdleWork(Protocol):
    def on_state(self, state: CoordinatorState) -> None:
        """A new coordinator state: a warm-up or round needs the model back."""

    def model_free(self, state: CoordinatorState) -> None:
        """The cooldown's checkpoint is written and shared: the model is idle."""

    async def close(self) -> None: ...
