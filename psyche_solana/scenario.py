"""A run on our programs inside an in-process LiteSVM, for tests and benchmarks.

    run = SvmRun.create(state_file)        # account, init, config, model, resume
    run.authorize_permissionless()
    run.join(client_keypair); run.tick(); run.witness(client_keypair, witness)
    run.account().state                    # the decoded coordinator.CoordinatorState
"""

from __future__ import annotations

from collections.abc import Sequence

from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator import NodeIdentity, Witness
from coordinator.committee import CommitteeProof
from coordinator.config import GcsCheckpoint, HubCheckpoint, StateFile
from psyche_solana import instructions as ix
from psyche_solana.accounts import (
    COORDINATOR_ACCOUNT_SIZE,
    CoordinatorAccount,
    decode_coordinator,
)
from psyche_solana.svm import ProgramSvm, Sent


class SvmRun:
    def __init__(self, svm: ProgramSvm, account: Pubkey, authority: Keypair,
                 join_authority: Keypair):
        self.svm, self.address = svm, account
        self.authority, self.join_authority = authority, join_authority

    @classmethod
    def create(cls, state_file: StateFile, svm: ProgramSvm | None = None,
               start: bool = True) -> SvmRun:
        svm = svm or ProgramSvm()
        authority, join_authority, account = Keypair(), Keypair(), Keypair()
        svm.airdrop(authority.pubkey(), 10 * 10**9)
        svm.airdrop(join_authority.pubkey(), 10 * 10**9)
        rent = svm.svm.minimum_balance_for_rent_exemption(COORDINATOR_ACCOUNT_SIZE)
        svm.send([
            ix.create_coordinator_account(svm.payer.pubkey(), account.pubkey(), rent),
            ix.init_coordinator(account.pubkey(), svm.payer.pubkey(), state_file.run_id,
                                authority.pubkey(), join_authority.pubkey(),
                                state_file.client_version)], [account])
        run = cls(svm, account.pubkey(), authority, join_authority)
        run.admin([ix.update_config(account.pubkey(), authority.pubkey(), state_file.config)])
        for instruction in ix.update_model(account.pubkey(), authority.pubkey(), state_file.model):
            run.admin([instruction])
        if start:
            run.admin([ix.set_paused(account.pubkey(), authority.pubkey(), False)])
        return run

    def admin(self, instructions: Sequence[Instruction]) -> Sent:
        return self.svm.send(instructions, [self.authority])

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

    def join(self, client: Keypair, authorization: Pubkey | None = None) -> Sent:
        authorization = authorization or ix.authorization_address(
            self.join_authority.pubkey(), Pubkey.default())
        return self.svm.send([ix.join_run(self.address, client.pubkey(), authorization)], [client])

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

    def set_paused(self, paused: bool) -> Sent:
        return self.admin([ix.set_paused(self.address, self.authority.pubkey(), paused)])

    def set_rates(self, earning: int | None, slashing: int | None) -> Sent:
        return self.admin([ix.set_future_epoch_rates(self.address, self.authority.pubkey(),
                                                     earning, slashing)])

    def account(self) -> CoordinatorAccount:
        return decode_coordinator(self.svm.data(self.address))
