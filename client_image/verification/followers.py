"""A client's shadows of the trainers it follows this epoch (coordinator/verification.py
elects who follows whom; replay.py is the shadow itself).

    follow(trainers)                  at the epoch's first round: one shadow per trainer,
                                      each from a zero delta (every trainer reset its own
                                      at the epoch's start)
    replay(trainer, step, batch)      after the step's apply, before this client's own
                                      train: what the trainer should publish for `batch`
    verify(trainer, step, published)  when the step's consensus result is applied: the
                                      distances and the verdict

Declared settings (formats/replay_settings.py): a trainer writes the settings it trains in
(dtype, micro-batch size, attention kernel, threads, oneDNN, device, torch build) into
every result's header. At `follow`, each shadow replays in the settings its trainer last
declared (`known`, from any of its earlier results this client saw) when this machine can
reproduce them, else in this follower's own settings. A result is judged with the tight
DECLARED_THRESHOLDS only when its declaration is exactly what its shadow replayed in all
epoch; otherwise (a declaration this machine cannot reproduce, or one that changed since
the shadow started) with the loose THRESHOLDS, and the verdict says
which and why (`Checked.replayed`), and counts this epoch's loose judgements of the trainer
(`Checked.judged_loosely`): a trainer that declares what none of its followers can
reproduce shows as judged loosely at every result.

Replay classes (formats/replay_settings.py `replay_class_of`, coordinator/verification.py):
each client joins with the class of the settings it trains in (every setting a replay must
match), and the coordinator elects a trainer's followers among its own class first. Same
class means same settings: a follower following a trainer of its own nonzero class
(`follow`'s `joined_classes`, the trainers whose joined class in the coordinator state is
this follower's, which is the class of its own settings) replays it in its own settings
and judges it with the tight DECLARED_THRESHOLDS from round 0 of the trainer's first epoch,
when no result of it has declared anything yet (`Checked.replayed` "declared (same class)"):
a cheater joining under a fresh key every epoch is not judged loosely. It never judges such
a trainer loosely. It fails a result whose declaration is of another class than the trainer
joined with (`OTHER_CLASS`: settings other than its class promised), one whose declaration
is of that class but that this machine cannot reproduce (`cannot_reproduce` gives a reason:
`SAME_CLASS_UNREPRODUCIBLE` + why), and one whose declaration is of that class and
reproducible but not the settings it was replayed in (`SAME_CLASS_OTHER_SETTINGS`), all
reported as UNDECLARED is. Why the last two: a 16-bit class is cheap to collide on purpose
(about 2^16 tries find a fake hardware string or thread count hashing to the majority's
class), which would otherwise buy the loose limits. Their price: two honest setups whose
classes collide (1 in 65,536 per pair of distinct setups) fail each other's results. A
trainer followed by a follower of another class (a global follower) is judged as before:
tightly where that follower knew and can reproduce its declaration, loosely where not
(docs/verification.md).

A result with no declaration is not judged at all: it fails (`UNDECLARED`), and the client
reports it as it reports any other failed replay. Every client of a run runs the run's
client version, and every current trainer declares (runtime/trainer_choice.py, and
runtime/worker.py for a model split over ranks), so only a trainer that left its
declaration out on purpose, to be judged with the loose limits, sends one. The decoder
still accepts such bytes (formats/distro_wire.py): this is a verdict, not a wire error.

Thresholds (THRESHOLDS, by the compute dtype the follower replays in, the trainer's):
honest replays are not exact on another machine. Another thread count, micro-batch split
or SDPA kernel moves a result's top-k indices. The shadow's error feedback subtracts what
the trainer published (replay.py, `adopt`), so in fp32 a moved index no longer carries
into later steps on most trajectories (over 3 seeds: Jaccard p99 0.13, Hamming 0, but
max 0.58 and Manhattan max 0.94 on one `mixed` 1-bit trajectory); in bf16 the gradients' own rounding still accumulates in the momentum (Jaccard up
to 0.70), and the signs of shared slots almost never disagree (Hamming at most 0.0018).
The limits are 3 x the largest honest distance, with floors (bench/verification.py; the
figures and what they leave undetected are in docs/verification.md, "Honest noise and
thresholds"). A swarm whose clients train in different dtypes must not turn verification
on; GPU noise is not measured yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from client_image.formats.distro_wire import ResultDecodeError
from client_image.formats.replay_settings import ReplaySettings, replay_class_of
from client_image.verification.replay import (
    ReplayVerifier,
    ShadowTrainer,
    Thresholds,
    Verdict,
    judge,
)
from client_image.verification.settings import active, cannot_reproduce
from client_image.verification.similarity import Distances

# The loose thresholds: a replay not in the trainer's declared settings, by the compute
# dtype it replays in (the trainer's: a swarm trains in one dtype), floors 0.02 / 0.002 /
# 0.02 (bench/verification.py; docs/verification.md "Honest noise and thresholds"). fp32:
# 3 x the largest distance of 1,152 undeclared honest fp32 replays over 3 seeds with the
# shadow adopting the published results
# (bench/results/verification_declared_fp32_3seeds_2cores.txt; one seed's 0.2217 / 0.169
# did not hold: `mixed` 1-bit reached Jaccard 0.58 on another seed). bf16: kept at
# 3 x the largest of 1,152 replays of the earlier 3-seed run
# (bench/results/verification_noise_2cores.txt): adopting did not shrink bf16's Jaccard and
# Manhattan (gradient rounding drifts there), so replay judges bf16 by Hamming alone, and
# one seed is too few to lower its Hamming limit.
THRESHOLDS = {
    "fp32": Thresholds(jaccard=1.7459, hamming=0.002, manhattan=2.8234),
    "bf16": Thresholds(jaccard=2.1835, hamming=0.0177, manhattan=3.7406),
}
DEFAULT_THRESHOLDS = THRESHOLDS["bf16"]
# The limits for a replay in the trainer's declared settings, by its dtype: the floors
# (0.02 / 0.002 / 0.02), because no honest replay in declared settings moved any distance
# off 0 (bench/verification.py `declared`, bench/results/verification_declared_2cores.txt;
# docs/verification.md "Declared replay settings"). The floors are the room left for what a
# declaration does not pin down and this bench could not vary: CPU models of one declared
# vector width, GPUs of one name, GPU kernels that are not deterministic run to run.
DECLARED_THRESHOLDS = {
    "fp32": Thresholds(jaccard=0.02, hamming=0.002, manhattan=0.02),
    "bf16": Thresholds(jaccard=0.02, hamming=0.002, manhattan=0.02),
}
KEPT_STEPS = 4  # expected results wait for their step's apply, two rounds later
# The verdict's reason for a result without replay settings (module docstring).
UNDECLARED = ("undeclared: the result carries no replay settings, which every client of "
              "the run's version declares")
# The verdict's reason for a trainer of this follower's class declaring another (module
# docstring).
OTHER_CLASS = "declared settings of another replay class than it joined with"
# The verdict's reason, followed by `cannot_reproduce`'s why, for a trainer of this
# follower's class declaring settings of that class this machine cannot reproduce (a
# collision of 16-bit classes, on purpose or not: module docstring).
SAME_CLASS_UNREPRODUCIBLE = ("joined this follower's replay class but declared settings it "
                             "cannot reproduce: ")
# The verdict's reason, followed by the differences, for a trainer of this follower's class
# declaring reproducible settings of that class other than this follower's own (a collision
# of 16-bit classes: module docstring).
SAME_CLASS_OTHER_SETTINGS = ("joined this follower's replay class but declared other settings "
                             "than the class's: ")
# `Checked.replayed` for a trainer of this follower's class replayed in the follower's own
# settings because its declaration was unknown at the epoch's start (module docstring).
SAME_CLASS_REPLAY = "declared (same class)"


@dataclass(frozen=True)
class Checked:
    """One verified result: the verdict and the evidence a report carries."""

    verdict: Verdict
    published_hash: bytes
    expected_hash: bytes
    # "declared" (replayed in the trainer's declared settings, tight limits), "declared
    # (same class)" (a trainer of this follower's class whose declaration was unknown at the
    # epoch's start, replayed in this follower's own settings, which its class promised:
    # tight limits), why not
    # (loose limits): "cannot replay ...", "not replayed in the declared settings ...",
    # "undeclared" (no settings in the result: failed, UNDECLARED) or "other class: ..."
    # (declared another replay class than it joined with: failed, OTHER_CLASS) or
    # "same class, cannot replay: ..." (declared this follower's class but settings it
    # cannot reproduce: failed, SAME_CLASS_UNREPRODUCIBLE) or "same class, other settings:
    # ..." (declared this follower's class but other settings: failed,
    # SAME_CLASS_OTHER_SETTINGS)
    replayed: str = "declared"
    # How many of this trainer's results this follower judged with the loose limits this
    # epoch, this one included (0 when every one was replayed in its declaration).
    judged_loosely: int = 0


class Followers:
    def __init__(self, make_shadow: Callable[[int, ReplaySettings], ShadowTrainer],
                 own: ReplaySettings, *, known: dict[bytes, ReplaySettings] | None = None,
                 thresholds: dict[str, Thresholds] | None = None,
                 declared_thresholds: dict[str, Thresholds] | None = None):
        """`make_shadow(start_step, settings)`: a fresh shadow trainer (replay.py) from a
        zero delta at `start_step`, on this client's model with the run's optimizer and
        schedule, training in `settings`' dtype and micro-batch size. `own`: this
        follower's settings (its device, and what it replays in when a trainer's are not
        known or not reproducible here). `known`: each trainer's last declaration seen
        (kept across epochs by the caller; `note_declared` adds to it)."""
        self.make_shadow = make_shadow
        self.own = own
        self.known: dict[bytes, ReplaySettings] = {} if known is None else known
        self.thresholds = THRESHOLDS if thresholds is None else thresholds
        self.declared_thresholds = (DECLARED_THRESHOLDS if declared_thresholds is None
                                    else declared_thresholds)
        self.shadows: dict[bytes, ReplayVerifier] = {}
        self.replay_in: dict[bytes, ReplaySettings] = {}
        self.unreproducible: dict[bytes, str] = {}  # trainer -> why its declaration is not
        self.judged_loosely: dict[bytes, int] = {}  # trainer -> loose verdicts this epoch
        self.joined_classes: dict[bytes, int] = {}  # same-class trainer -> its class
        self.same_class: set[bytes] = set()  # replayed in `own`, its class being theirs
        self.known_at_start: set[bytes] = set()  # same-class, declared `own` before
        self.expected: dict[tuple[bytes, int], bytes] = {}

    def note_declared(self, trainer: bytes, settings: ReplaySettings | None) -> None:
        """A result of `trainer` declared `settings` (the next `follow` replays in them)."""
        if settings is not None:
            self.known[trainer] = settings

    def follow(self, trainers: Sequence[bytes], start_step: int,
               joined_classes: Mapping[bytes, int] | None = None) -> None:
        """Shadows for exactly `trainers`, all starting from a zero delta, each replaying in
        its trainer's last declared settings where this machine can (module docstring).
        `joined_classes`: the trainers this client follows within its own (nonzero) replay
        class, each with the class the coordinator state gives it; their results must
        declare settings of that class that this machine can reproduce, else they fail. Those
        whose class is that of this follower's own settings are replayed in them (same class
        means same settings), known or not."""
        self.expected.clear()
        self.replay_in, self.unreproducible, self.shadows = {}, {}, {}
        self.judged_loosely = {}
        self.joined_classes = dict(joined_classes or {})
        own_class = replay_class_of(self.own)
        self.same_class = {key for key, joined in self.joined_classes.items()
                           if joined == own_class}
        self.known_at_start = set()
        for key in trainers:
            settings = self.own
            declared = self.known.get(key)
            if key in self.same_class:
                if declared == self.own:
                    self.known_at_start.add(key)
            elif declared is not None:
                why = cannot_reproduce(declared, self.own.device)
                if why is None:
                    settings = declared
                else:
                    self.unreproducible[key] = why
            self.replay_in[key] = settings
            self.shadows[key] = ReplayVerifier(self.make_shadow(start_step, settings))

    def replay(self, trainer: bytes, step: int, batch: torch.Tensor,
               batch_id: tuple[int, int], cold_start: bool) -> None:
        shadow = self.shadows.get(trainer)
        if shadow is None:
            return
        with active(self.replay_in[trainer]):
            self.expected[(trainer, step)] = shadow.expected_payload(step, batch, batch_id,
                                                                     cold_start)
        for key in [k for k in self.expected if k[1] <= step - KEPT_STEPS]:
            del self.expected[key]

    def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        """None when `trainer`'s batch of `step` was not replayed here."""
        shadow = self.shadows.get(trainer)
        expected = self.expected.pop((trainer, step), None)
        if shadow is None or expected is None:
            return None
        digest = hashlib.sha256(published).digest()
        expected_hash = hashlib.sha256(expected).digest()
        try:
            result = shadow.shadow.decode(published)
        except ResultDecodeError as exc:  # verified on download: never expected here
            worst = Distances(jaccard=1.0, hamming=1.0, manhattan=1.0)
            return Checked(Verdict(False, worst, f"undecodable: {exc}"), digest, expected_hash)
        distances = shadow.distances(result, shadow.shadow.decode(expected))
        if result.settings is None:  # the distances stay as the report's evidence
            return Checked(Verdict(False, distances, UNDECLARED), digest, expected_hash,
                           "undeclared")
        self.note_declared(trainer, result.settings)
        joined = self.joined_classes.get(trainer)
        declared_class = replay_class_of(result.settings)
        if joined is not None and declared_class != joined:
            return Checked(Verdict(False, distances, OTHER_CLASS), digest, expected_hash,
                           f"other class: joined with {joined}, declared {declared_class} "
                           f"({result.settings.describe()})")
        if joined is not None:
            why = cannot_reproduce(result.settings, self.own.device)
            if why is not None:
                return Checked(Verdict(False, distances, SAME_CLASS_UNREPRODUCIBLE + why),
                               digest, expected_hash, f"same class, cannot replay: {why}")
        if trainer in self.same_class and result.settings != self.replay_in[trainer]:
            differences = "; ".join(self.replay_in[trainer].differences(result.settings))
            return Checked(Verdict(False, distances, SAME_CLASS_OTHER_SETTINGS + differences),
                           digest, expected_hash, f"same class, other settings: {differences}")
        replayed = self.how_replayed(trainer, result.settings)
        if (trainer in self.same_class and replayed == "declared"
                and trainer not in self.known_at_start):
            replayed = SAME_CLASS_REPLAY
        loosely = self.judged_loosely.get(trainer, 0)
        if replayed in ("declared", SAME_CLASS_REPLAY):
            limits = self.declared_thresholds[self.replay_in[trainer].compute]
        else:
            limits = self.thresholds[self.replay_in[trainer].compute]
            loosely += 1
            self.judged_loosely[trainer] = loosely
        verdict = judge(distances, limits)
        if verdict.ok:  # the shadow's momentum follows what the trainer sent (replay.py)
            shadow.adopt(step, result)
        return Checked(verdict, digest, expected_hash, replayed, loosely)

    def how_replayed(self, trainer: bytes, declared: ReplaySettings) -> str:
        """"declared" when the shadow replayed in exactly `declared`, else why not."""
        why = cannot_reproduce(declared, self.own.device)
        if why is not None:
            return f"cannot replay the declared settings: {why}"
        replayed_in = self.replay_in[trainer]
        if declared != replayed_in:
            return ("not replayed in the declared settings (learned late, or changed): "
                    + "; ".join(replayed_in.differences(declared)))
        return "declared"
