"""A run on our programs inside an in-process LiteSVM, for tests and benchmarks.

    run = SvmRun.create(state_file)        # account, init, config, model, resume
    run.authorize_permissionless()
    run.join(client_keypair); run.tick(); run.witness(client_keypair, witness)
    run.account().state                    # the decoded coordinator.CoordinatorState
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator import (
    Bloom,
    CoordinatorState,
    NodeIdentity,
    RunState,
    Witness,
    WitnessProof,
    participant_item,
    selection_for_round,
)
from coordinator.committee import CommitteeProof
from coordinator.config import GcsCheckpoint, HubCheckpoint, StateFile
from coordinator.state import VerificationReport
from psyche_solana import instructions as ix
from psyche_solana.accounts import (
    COORDINATOR_ACCOUNT_SIZE,
    CoordinatorAccount,
    decode_coordinator,
)
from psyche_solana.svm import ProgramSvm, Sent


class SvmRun:
    def __init__(self, svm: ProgramSvm, account: Pubkey, authority: Keypair,
                 join_authority: Keypair, treasurer_index: int | None = None,
                 mint: Keypair | None = None):
        self.svm, self.address = svm, account
        self.authority, self.join_authority = authority, join_authority
        self.treasurer_index, self.mint = treasurer_index, mint

    @classmethod
    def create(cls, state_file: StateFile, svm: ProgramSvm | None = None,
               start: bool = True, treasurer: bool = False, decimals: int = 6) -> SvmRun:
        """A run, created directly or through the treasurer (then a mint is made too)."""
        svm = svm or ProgramSvm()
        authority, join_authority, account = Keypair(), Keypair(), Keypair()
        svm.airdrop(authority.pubkey(), 10 * 10**9)
        svm.airdrop(join_authority.pubkey(), 10 * 10**9)
        rent = svm.svm.minimum_balance_for_rent_exemption(COORDINATOR_ACCOUNT_SIZE)
        create = ix.create_coordinator_account(svm.payer.pubkey(), account.pubkey(), rent)
        payer = svm.payer.pubkey()
        if treasurer:
            mint = Keypair()
            index = ix.default_treasurer_index(state_file.run_id)
            mint_rent = svm.svm.minimum_balance_for_rent_exemption(ix.MINT_SIZE)
            svm.send(ix.create_mint(payer, mint.pubkey(), mint_rent, decimals, authority.pubkey()),
                     [mint])
            svm.send([create, ix.treasurer_run_create(
                payer, index, account.pubkey(), state_file.run_id, authority.pubkey(),
                join_authority.pubkey(), state_file.client_version, mint.pubkey()),
                ix.create_associated_token_account(payer, ix.treasurer_run_address(index),
                                                   mint.pubkey())], [account])
            run = cls(svm, account.pubkey(), authority, join_authority, index, mint)
        else:
            svm.send([create, ix.init_coordinator(
                account.pubkey(), payer, state_file.run_id, authority.pubkey(),
                join_authority.pubkey(), state_file.client_version)], [account])
            run = cls(svm, account.pubkey(), authority, join_authority)
        run.admin([ix.update_config(account.pubkey(), authority.pubkey(), state_file.config)])
        for instruction in ix.update_model(account.pubkey(), authority.pubkey(), state_file.model):
            run.admin([instruction])
        if start:
            run.admin([ix.set_paused(account.pubkey(), authority.pubkey(), False)])
        return run

    @property
    def instance(self) -> Pubkey:
        """The run id's claim (the coordinator instance PDA)."""
        return ix.coordinator_instance_address(self.account().run_id)

    def admin(self, instructions: Sequence[Instruction], signer: Keypair | None = None) -> Sent:
        """Admin coordinator instructions, forwarded by the treasurer for treasurer runs."""
        signer = signer or self.authority
        if self.treasurer_index is not None:
            instructions = [ix.treasurer_run_update(signer.pubkey(), self.treasurer_index,
                                                    self.address, inner)
                            for inner in instructions]
        return self.svm.send(instructions, [signer])

    def top_up(self, amount: int) -> None:
        """Mint `amount` base units straight into the run's reward vault."""
        assert self.mint is not None and self.treasurer_index is not None
        vault = ix.associated_token_address(ix.treasurer_run_address(self.treasurer_index),
                                            self.mint.pubkey())
        self.svm.send([ix.mint_to(self.mint.pubkey(), vault, self.authority.pubkey(), amount)],
                      [self.authority])

    def claim(self, user: Keypair, points: int) -> Sent:
        assert self.mint is not None and self.treasurer_index is not None
        mint = self.mint.pubkey()
        return self.svm.send([
            ix.create_associated_token_account(user.pubkey(), user.pubkey(), mint),
            ix.treasurer_claim(user.pubkey(), self.treasurer_index, self.address, mint, points)],
            [user], payer=user)

    def token_balance(self, owner: Pubkey) -> int:
        assert self.mint is not None
        return ix.token_amount(self.svm.data(ix.associated_token_address(owner, self.mint.pubkey())))

    def authorize(self, grantee: Pubkey, delegates: Sequence[Keypair] = (),
                  grantee_keypair: Keypair | None = None) -> Pubkey:
        grantor = self.join_authority
        address = ix.authorization_address(grantor.pubkey(), grantee)
        self.svm.send([ix.authorization_create(self.svm.payer.pubkey(), grantor.pubkey(), grantee),
                       ix.authorization_grantor_update(grantor.pubkey(), address, True)], [grantor])
        if delegates:
            assert grantee_keypair is not None
            self.svm.send([ix.authorization_grantee_update(
                grantee, address, True, [d.pubkey() for d in delegates])], [grantee_keypair])
        return address

    def authorize_permissionless(self) -> Pubkey:
        return self.authorize(Pubkey.default())

    def join(self, client: Keypair, authorization: Pubkey | None = None,
             replay_class: int = 0) -> Sent:
        authorization = authorization or ix.authorization_address(
            self.join_authority.pubkey(), Pubkey.default())
        return self.svm.send([ix.join_run(self.address, client.pubkey(), authorization,
                                          replay_class)], [client])

    def tick(self) -> Sent:
        return self.svm.send([ix.tick(self.address)])

    def warmup_witness(self, client: Keypair, witness: Witness) -> Sent:
        return self.svm.send([ix.warmup_witness(self.address, client.pubkey(), witness)], [client])

    def witness(self, client: Keypair, witness: Witness) -> Sent:
        return self.svm.send([ix.witness(self.address, client.pubkey(), witness)], [client])

    def health_check(self, client: Keypair, target: NodeIdentity, proof: CommitteeProof) -> Sent:
        return self.svm.send([ix.health_check(self.address, client.pubkey(), target, proof)],
                             [client])

    def checkpoint(self, client: Keypair, index: int, repo: HubCheckpoint | GcsCheckpoint) -> Sent:
        return self.svm.send([ix.checkpoint(self.address, client.pubkey(), index, repo)], [client])

    def verification_report(self, client: Keypair, report: VerificationReport) -> Sent:
        """`client` reports `report.accused` (it must be `report.reporter`)."""
        return self.svm.send([ix.verification_report(self.address, client.pubkey(), report)],
                             [client])

    def set_paused(self, paused: bool) -> Sent:
        return self.admin([ix.set_paused(self.address, self.authority.pubkey(), paused)])

    def accept_model_loss(self) -> Sent:
        return self.admin([ix.accept_model_loss(self.address, self.authority.pubkey())])

    def set_rates(self, earning: int | None, slashing: int | None) -> Sent:
        return self.admin([ix.set_future_epoch_rates(self.address, self.authority.pubkey(),
                                                     earning, slashing)])

    def account(self) -> CoordinatorAccount:
        return decode_coordinator(self.svm.data(self.address))

    def _state(self) -> CoordinatorState:
        state = self.account().state
        assert state is not None, "the run has no state before update-config"
        return state

    # ------------------------------------------------------------ playing a run
    def honest_witness(self, client: Keypair, warmup: bool = False) -> Witness | None:
        """The witness `client` would send now (None if it is not elected / not listed)."""
        state = self.account().state
        assert state is not None
        node = NodeIdentity(bytes(client.pubkey()))
        index = state.index_of(node)
        if index is None:
            return None
        if warmup:
            proof = WitnessProof(index, index, False)
        else:
            proof = selection_for_round(state).witness_of(index)
            if not proof.witness:
                return None
        seen = Bloom(keys=tuple(range(1, 9)))
        for listed in state.epoch_state.clients:
            seen.add(participant_item(listed.id.key))
        return Witness(proof, seen, Bloom(keys=tuple(range(11, 19))), bytes(32))

    def play_until(self, clients: Sequence[Keypair], done: Callable[[CoordinatorState], bool],
                   step_seconds: int = 3, max_steps: int = 200) -> dict[str, int]:
        """Drive the run like live `clients` would until `done(state)`: in warm-up the listed
        ones send warm-up witnesses until it ends, in a training round the elected ones
        witness, then `step_seconds` pass and a tick is sent. Returns transaction counts
        per kind; raises AssertionError when `done` is not reached in `max_steps`."""
        by_node = {NodeIdentity(bytes(client.pubkey())): client for client in clients}
        counts = {"tick": 0, "witness": 0, "warmup_witness": 0}
        for _ in range(max_steps):
            state = self._state()
            if done(state):
                return counts
            if state.run_state is RunState.Warmup:
                for listed in state.epoch_state.clients:
                    client = by_node.get(listed.id)
                    if client is None:
                        continue
                    if self._state().run_state is not RunState.Warmup:
                        break  # the last witness ended it
                    witness = self.honest_witness(client, warmup=True)
                    assert witness is not None
                    self.warmup_witness(client, witness)
                    counts["warmup_witness"] += 1
            elif state.run_state is RunState.RoundTrain:
                selection = selection_for_round(state)
                for index, listed in enumerate(state.epoch_state.clients):
                    client = by_node.get(listed.id)
                    if client is not None and selection.witness_of(index).witness:
                        witness = self.honest_witness(client)
                        assert witness is not None
                        self.witness(client, witness)
                        counts["witness"] += 1
            self.svm.advance(step_seconds)
            self.tick()
            counts["tick"] += 1
        raise AssertionError(f"the run did not get there in {max_steps} steps")

    def play_epoch(self, clients: Sequence[Keypair], step_seconds: int = 3,
                   max_steps: int = 200) -> dict[str, int]:
        """Drive one epoch like live clients would (play_until the next epoch or a halt)."""
        start_epoch = self._state().progress.epoch
        return self.play_until(
            clients, lambda state: state.progress.epoch > start_epoch or state.run_state.halted,
            step_seconds, max_steps)
