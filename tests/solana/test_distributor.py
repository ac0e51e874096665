"""The distributor program in LiteSVM: a Merkle airdrop with linear vesting paid from its
vault (the whole flow), every refusal with its named program error and no account
changed (the attack table), and the Merkle tree the proofs come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from psyche_solana import distributor as dist
from psyche_solana import instructions as ix
from psyche_solana.errors import error_name
from psyche_solana.ids import TOKEN_PROGRAM_ID, distributor_program
from psyche_solana.merkle import Allocation, MerkleTree, Vesting, leaf_hash, parent_hash, verify
from psyche_solana.svm import ProgramSvm, TransactionFailed

pytestmark = pytest.mark.timeout(120)
T0 = 1_700_000_000


@dataclass
class Drop:
    """An airdrop funded with exactly its allocations' total."""
    svm: ProgramSvm
    authority: Keypair
    mint: Pubkey
    airdrop_id: int
    recipients: list[Keypair]
    allocations: list[Allocation]
    tree: MerkleTree

    def line(self, i: int) -> tuple[Allocation, list[bytes]]:
        return self.allocations[i], self.tree.proof(i)

    def redeem(self, i: int, amount: int, signer: Keypair | None = None,
               proof: list[bytes] | None = None, vesting: Vesting | None = None) -> Instruction:
        signer = signer or self.recipients[i]
        allocation, own_proof = self.line(i)
        return dist.claim_redeem(signer.pubkey(), self.airdrop_id, self.mint,
                                 ix.associated_token_address(signer.pubkey(), self.mint),
                                 allocation.nonce, vesting or allocation.vesting, amount,
                                 own_proof if proof is None else proof)

    def balance(self, owner: Pubkey) -> int:
        return ix.token_amount(self.svm.data(ix.associated_token_address(owner, self.mint)))

    def vault(self) -> int:
        return ix.token_amount(self.svm.data(dist.vault_address(self.airdrop_id, self.mint)))

    def airdrop(self) -> dist.Airdrop:
        return dist.decode_airdrop(self.svm.data(dist.airdrop_address(self.airdrop_id)))


def _keys(svm: ProgramSvm, n: int) -> list[Keypair]:
    keys = [Keypair() for _ in range(n)]
    for key in keys:
        svm.airdrop(key.pubkey(), 10**10)
    return keys


def make_drop(svm: ProgramSvm, vestings: list[Vesting], airdrop_id: int = 7,
              extra_users: int = 1) -> tuple[Drop, list[Keypair]]:
    authority, *users = _keys(svm, 1 + len(vestings) + extra_users)
    mint = Keypair()
    svm.send(ix.create_mint(authority.pubkey(), mint.pubkey(),
                            svm.svm.minimum_balance_for_rent_exemption(ix.MINT_SIZE), 6,
                            authority.pubkey()), [authority, mint], payer=authority)
    total = sum(v.end_collateral_amount for v in vestings)
    source = ix.associated_token_address(authority.pubkey(), mint.pubkey())
    svm.send([ix.create_associated_token_account(authority.pubkey(), authority.pubkey(), mint.pubkey()),
              ix.mint_to(mint.pubkey(), source, authority.pubkey(), 10 * total)], [authority])
    for user in users:
        svm.send([ix.create_associated_token_account(user.pubkey(), user.pubkey(), mint.pubkey())],
                 [user])
    recipients = users[:len(vestings)]
    allocations = [Allocation(bytes(k.pubkey()), 0, v) for k, v in zip(recipients, vestings, strict=True)]
    tree = MerkleTree([a.leaf() for a in allocations])
    svm.send([dist.airdrop_create(authority.pubkey(), authority.pubkey(), airdrop_id,
                                  mint.pubkey(), tree.root, b"test airdrop")], [authority])
    svm.send([ix.token_transfer_checked(source, mint.pubkey(),
                                        dist.vault_address(airdrop_id, mint.pubkey()),
                                        authority.pubkey(), total, 6)], [authority])
    for key in recipients:
        svm.send([dist.claim_create(key.pubkey(), key.pubkey(), airdrop_id)], [key])
    drop = Drop(svm, authority, mint.pubkey(), airdrop_id, recipients, allocations, tree)
    return drop, users[len(vestings):]


VESTINGS = [Vesting(T0, 1000, 1000),        # linear over 1000 s from now
            Vesting(T0 + 500, 1000, 3000),  # starts later
            Vesting(T0, 0, 500),            # all at once
            Vesting(T0 - 100, 301, 7)]      # a rounding case: 7 * elapsed / 301


def _error(svm: ProgramSvm, instructions: list[Instruction], signers: list[Keypair]) -> str:
    with pytest.raises(TransactionFailed) as caught:
        svm.send(instructions, signers)
    assert caught.value.code is not None, str(caught.value)
    return error_name(caught.value.code)


def test_recipients_redeem_what_has_vested_and_never_more_than_the_vault_holds():
    svm = ProgramSvm()
    drop, _ = make_drop(svm, VESTINGS)
    a, b, c, d = drop.recipients
    funded = drop.vault()
    assert funded == 4507
    airdrop = drop.airdrop()
    assert (airdrop.authority, airdrop.collateral_mint, airdrop.merkle_root, airdrop.claim_freeze,
            airdrop.metadata) == (drop.authority.pubkey(), drop.mint, drop.tree.root, False,
                                  b"test airdrop")

    def paid() -> int:
        return sum(drop.balance(k.pubkey()) for k in drop.recipients)

    assert _error(svm, [drop.redeem(0, 1)], [a]) == "NothingVestedYet"
    svm.send([drop.redeem(2, 500)], [c])  # no vesting period: all of it at once
    svm.advance(250)  # a: 250 of 1000 vested; b not started; d: 7 * 350 / 301 = 8 > 7 -> 7
    svm.send([drop.redeem(0, 100)], [a])
    svm.send([drop.redeem(0, 150)], [a])
    assert _error(svm, [drop.redeem(0, 1)], [a]) == "MoreThanVested"
    assert _error(svm, [drop.redeem(1, 1)], [b]) == "NothingVestedYet"
    svm.send([drop.redeem(3, 7)], [d])
    assert drop.balance(a.pubkey()) == 250 and paid() == 757
    assert drop.vault() + paid() == funded

    svm.advance(550)  # t0 + 800: a 800 vested, b 3000 * 300 / 1000 = 900
    assert _error(svm, [drop.redeem(1, 901)], [b]) == "MoreThanVested"
    svm.send([drop.redeem(1, 900)], [b])
    svm.advance(10_000)  # everything vested
    svm.send([drop.redeem(0, 750)], [a])
    svm.send([drop.redeem(1, 2100)], [b])
    assert [drop.balance(k.pubkey()) for k in drop.recipients] == [1000, 3000, 500, 7]
    assert drop.vault() == 0 and paid() == funded
    assert drop.airdrop().total_claimed_collateral_amount == funded
    claim = dist.decode_claim(svm.data(dist.claim_address(
        dist.airdrop_address(drop.airdrop_id), b.pubkey(), 0)))
    assert claim.claimed_collateral_amount == 3000
    for i, key in enumerate(drop.recipients):  # nothing left for anyone, ever
        assert _error(svm, [drop.redeem(i, 1)], [key]) == "MoreThanVested"


def test_the_authority_freezes_updates_and_claws_back_what_is_unclaimed():
    svm = ProgramSvm()
    drop, _ = make_drop(svm, VESTINGS[:3], airdrop_id=8)
    a, _b, c = drop.recipients
    svm.send([dist.airdrop_update(drop.authority.pubkey(), 8, claim_freeze=True)], [drop.authority])
    assert drop.airdrop().claim_freeze
    assert _error(svm, [drop.redeem(2, 500)], [c]) == "AirdropClaimsFrozen"
    svm.send([dist.airdrop_update(drop.authority.pubkey(), 8, claim_freeze=False)], [drop.authority])
    svm.send([drop.redeem(2, 500)], [c])
    assert _error(svm, [dist.airdrop_update(drop.authority.pubkey(), 8, merkle_root=bytes(32))],
                  [drop.authority]) == "MerkleRootZeroed"
    # a new root dropping recipient a: a's old proof no longer holds
    kept = MerkleTree([drop.allocations[1].leaf(), drop.allocations[2].leaf()])
    svm.send([dist.airdrop_update(drop.authority.pubkey(), 8, merkle_root=kept.root,
                                  metadata=b"round 2")], [drop.authority])
    assert drop.airdrop().merkle_root == kept.root and drop.airdrop().metadata == b"round 2"
    svm.advance(2000)
    assert _error(svm, [drop.redeem(0, 1)], [a]) == "WrongMerkleProof"
    before = drop.balance(drop.authority.pubkey())
    unclaimed = drop.vault()
    assert unclaimed == 4000
    receiver = ix.associated_token_address(drop.authority.pubkey(), drop.mint)
    svm.send([dist.airdrop_withdraw(drop.authority.pubkey(), 8, drop.mint, receiver, unclaimed)],
             [drop.authority])
    assert drop.vault() == 0 and drop.balance(drop.authority.pubkey()) == before + unclaimed
    with pytest.raises(TransactionFailed, match=r"InsufficientFunds|error 1"):
        svm.send([drop.redeem(1, 1, proof=kept.proof(0))], [drop.recipients[1]])


def test_a_vault_created_beforehand_does_not_block_the_airdrop():
    """Airdrop addresses are predictable: anyone may create the vault's token account
    first; airdrop_create still succeeds with it."""
    svm = ProgramSvm()
    drop, (squatter,) = make_drop(svm, VESTINGS[:1], airdrop_id=20)
    svm.send([ix.create_associated_token_account(squatter.pubkey(), dist.airdrop_address(21),
                                                 drop.mint)], [squatter])
    root = MerkleTree([drop.allocations[0].leaf()]).root
    svm.send([dist.airdrop_create(drop.authority.pubkey(), drop.authority.pubkey(), 21, drop.mint,
                                  root)], [drop.authority])
    assert dist.decode_airdrop(svm.data(dist.airdrop_address(21))).merkle_root == root


# ------------------------------------------------------------------ attack table
@dataclass
class World:
    svm: ProgramSvm
    drop: Drop
    other: Drop          # a second airdrop of another authority and mint
    intruder: Keypair    # in neither; has a token account of drop's mint


@pytest.fixture(scope="module")
def world() -> World:
    svm = ProgramSvm()
    drop, (intruder,) = make_drop(svm, VESTINGS, airdrop_id=11)
    other, _ = make_drop(svm, VESTINGS[:2], airdrop_id=12)
    svm.send([dist.claim_create(intruder.pubkey(), intruder.pubkey(), 11)], [intruder])
    svm.advance(250)
    return World(svm, drop, other, intruder)


def _snapshot(svm: ProgramSvm) -> dict[Pubkey, tuple[Pubkey, int, bytes]]:
    return {address: (account.owner, account.lamports, bytes(account.data))
            for program in (distributor_program(), TOKEN_PROGRAM_ID)
            for address, account in svm.svm.get_program_accounts(program)}


def _with_account(instruction: Instruction, index: int, key: Pubkey,
                  signer: bool | None = None) -> Instruction:
    metas = list(instruction.accounts)
    old = metas[index]
    metas[index] = AccountMeta(key, old.is_signer if signer is None else signer, old.is_writable)
    return Instruction(instruction.program_id, bytes(instruction.data), metas)


def _forged(proof: list[bytes]) -> list[bytes]:
    return [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]


Case = Callable[[World], tuple[list[Instruction], list[Keypair]]]


def _intruder_redeems_as(i: int) -> Case:
    """The intruder sends recipient i's allocation and proof as its own (its own claim)."""
    def build(w: World) -> tuple[list[Instruction], list[Keypair]]:
        return [w.drop.redeem(i, 1, signer=w.intruder)], [w.intruder]
    return build


CASES: list[tuple[str, str, Case]] = [
    ("forged proof", "WrongMerkleProof",
     lambda w: ([w.drop.redeem(0, 1, proof=_forged(w.drop.tree.proof(0)))], [w.drop.recipients[0]])),
    ("proof of another leaf", "WrongMerkleProof",
     lambda w: ([w.drop.redeem(0, 1, proof=w.drop.tree.proof(1))], [w.drop.recipients[0]])),
    ("inflated allocation", "WrongMerkleProof",
     lambda w: ([w.drop.redeem(0, 1, vesting=Vesting(T0, 1000, 10**6))], [w.drop.recipients[0]])),
    ("earlier vesting start", "WrongMerkleProof",
     lambda w: ([w.drop.redeem(1, 1, vesting=Vesting(T0, 1000, 3000))], [w.drop.recipients[1]])),
    ("proof reused for another recipient", "WrongMerkleProof", _intruder_redeems_as(0)),
    ("proof of another airdrop", "WrongMerkleProof",
     lambda w: ([w.drop.redeem(0, 1, proof=w.other.tree.proof(0))], [w.drop.recipients[0]])),
    ("redeem through another recipient's claim", "WrongAccount",
     lambda w: ([_with_account(w.drop.redeem(0, 1, signer=w.intruder), 5, dist.claim_address(
         dist.airdrop_address(11), w.drop.recipients[0].pubkey(), 0))], [w.intruder])),
    ("claiming more than vested", "MoreThanVested",
     lambda w: ([w.drop.redeem(0, 251)], [w.drop.recipients[0]])),
    ("claiming before vesting starts", "NothingVestedYet",
     lambda w: ([w.drop.redeem(1, 1)], [w.drop.recipients[1]])),
    ("redeem unsigned", "MissingSignature",
     lambda w: ([_with_account(w.drop.redeem(0, 1), 0, w.drop.recipients[0].pubkey(), False)], [])),
    ("redeem from another airdrop's vault", "WrongVault",
     lambda w: ([_with_account(w.drop.redeem(0, 1), 3, dist.vault_address(12, w.other.mint))],
                [w.drop.recipients[0]])),
    ("redeem in another mint", "WrongAccount",
     lambda w: ([_with_account(w.drop.redeem(0, 1), 4, w.other.mint)], [w.drop.recipients[0]])),
    ("withdrawing as someone else", "NotAirdropAuthority",
     lambda w: ([dist.airdrop_withdraw(w.intruder.pubkey(), 11, w.drop.mint,
                                       ix.associated_token_address(w.intruder.pubkey(), w.drop.mint),
                                       1)], [w.intruder])),
    ("withdrawing with another airdrop's authority", "NotAirdropAuthority",
     lambda w: ([dist.airdrop_withdraw(w.other.authority.pubkey(), 11, w.drop.mint,
                                       ix.associated_token_address(w.intruder.pubkey(), w.drop.mint),
                                       1)], [w.other.authority])),
    ("withdraw unsigned", "MissingSignature",
     lambda w: ([_with_account(dist.airdrop_withdraw(
         w.drop.authority.pubkey(), 11, w.drop.mint,
         ix.associated_token_address(w.intruder.pubkey(), w.drop.mint), 1), 0,
         w.drop.authority.pubkey(), False)], [])),
    ("updating as someone else", "NotAirdropAuthority",
     lambda w: ([dist.airdrop_update(w.intruder.pubkey(), 11, merkle_root=bytes(range(32)))],
                [w.intruder])),
    ("freezing as someone else", "NotAirdropAuthority",
     lambda w: ([dist.airdrop_update(w.intruder.pubkey(), 11, claim_freeze=True)], [w.intruder])),
    ("a second claim account", "AlreadyInitialized",
     lambda w: ([dist.claim_create(w.intruder.pubkey(), w.intruder.pubkey(), 11)], [w.intruder])),
    ("an airdrop id taken", "AlreadyInitialized",
     lambda w: ([dist.airdrop_create(w.intruder.pubkey(), w.intruder.pubkey(), 11, w.drop.mint,
                                     bytes(range(32)))], [w.intruder])),
    ("an airdrop with a zero root", "MerkleRootZeroed",
     lambda w: ([dist.airdrop_create(w.intruder.pubkey(), w.intruder.pubkey(), 99, w.drop.mint,
                                     bytes(32))], [w.intruder])),
    ("an airdrop at a wrong address", "WrongAccount",
     lambda w: ([_with_account(dist.airdrop_create(
         w.intruder.pubkey(), w.intruder.pubkey(), 98, w.drop.mint, bytes(range(32))), 2,
         dist.airdrop_address(97))], [w.intruder])),
    ("a short redeem", "InvalidInstruction",
     lambda w: ([Instruction(distributor_program(), bytes(w.drop.redeem(0, 1).data)[:-1],
                             list(w.drop.redeem(0, 1).accounts))], [w.drop.recipients[0]])),
    ("an unknown instruction", "InvalidInstruction",
     lambda w: ([Instruction(distributor_program(), b"\1" * 8, list(w.drop.redeem(0, 1).accounts))],
                [w.drop.recipients[0]])),
]


@pytest.mark.parametrize("build,expected", [pytest.param(b, e, id=n) for n, e, b in CASES])
def test_refused_with_its_named_error_and_no_account_changes(world: World, build: Case,
                                                             expected: str) -> None:
    instructions, signers = build(world)
    before = _snapshot(world.svm)
    assert _error(world.svm, instructions, signers) == expected
    assert _snapshot(world.svm) == before, "a refused transaction changed an account"


def test_the_honest_claim_of_the_attack_world_still_works(world: World) -> None:
    """The refusals above are not the world being broken: the same recipient, with its own
    proof, redeems what has vested."""
    world.svm.send([world.drop.redeem(0, 250)], [world.drop.recipients[0]])
    assert world.drop.balance(world.drop.recipients[0].pubkey()) == 250


def test_a_frozen_airdrop_refuses_new_claims():
    svm = ProgramSvm()
    drop, (late,) = make_drop(svm, VESTINGS[:2], airdrop_id=13)
    svm.send([dist.airdrop_update(drop.authority.pubkey(), 13, claim_freeze=True)], [drop.authority])
    assert _error(svm, [dist.claim_create(late.pubkey(), late.pubkey(), 13)], [late]) \
        == "AirdropClaimsFrozen"


# ------------------------------------------------------------------ Merkle tree
def _allocations(n: int) -> list[Allocation]:
    return [Allocation(bytes([i + 1]) * 32, i % 2, Vesting(T0 + i, 60 * i, 1000 + i))
            for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 13])
def test_every_proof_verifies_its_own_leaf_only(n: int) -> None:
    leaves = [a.leaf() for a in _allocations(n)]
    tree = MerkleTree(leaves)
    for i, leaf in enumerate(leaves):
        assert verify(tree.root, leaf, tree.proof(i))
        for j, other in enumerate(leaves):
            if j != i:
                assert not verify(tree.root, other, tree.proof(i))
    assert MerkleTree(leaves).root == tree.root  # deterministic


def test_a_changed_leaf_changes_the_root() -> None:
    allocations = _allocations(5)
    root = MerkleTree([a.leaf() for a in allocations]).root
    first = allocations[2]
    changes = [Allocation(bytes([9]) * 32, first.nonce, first.vesting),
               Allocation(first.claimer, first.nonce + 1, first.vesting),
               Allocation(first.claimer, first.nonce, Vesting(T0 + 3, 120, 1002)),
               Allocation(first.claimer, first.nonce, Vesting(T0 + 2, 121, 1002)),
               Allocation(first.claimer, first.nonce, Vesting(T0 + 2, 120, 1003))]
    for changed in changes:
        leaves = [a.leaf() for a in allocations]
        leaves[2] = changed.leaf()
        assert MerkleTree(leaves).root != root


def test_the_hashes_are_psyches() -> None:
    """Leaf = sha256 of the 60 packed bytes; a parent hashes the sorted pair."""
    import hashlib
    import struct

    claimer = bytes(range(32))
    vesting = Vesting(-5, 7, 2**64 - 1)
    packed = claimer + struct.pack("<QqIQ", 3, -5, 7, 2**64 - 1)
    assert len(packed) == 60
    assert leaf_hash(claimer, 3, vesting) == hashlib.sha256(packed).digest()
    low, high = bytes(32), b"\1" * 32
    assert parent_hash(high, low) == parent_hash(low, high) == hashlib.sha256(low + high).digest()


def test_vesting_is_linear_and_rounds_down() -> None:
    vesting = Vesting(100, 301, 7)
    assert [vesting.vested(t) for t in (99, 100, 142, 143, 400, 401, 10**9)] == [0, 0, 0, 1, 6, 7, 7]
    assert Vesting(100, 0, 5).vested(100) == 5 and Vesting(100, 0, 5).vested(99) == 0
    with pytest.raises(ValueError, match="u32"):
        Vesting(0, 2**32, 1)


def test_every_instruction_stays_under_a_tenth_of_the_compute_limit() -> None:
    """The figures bench/solana.py prints as cu_airdrop_* (the redeem with a 16-hash proof)."""
    from bench.solana import CU_LIMIT, airdrop_compute_units

    figures = airdrop_compute_units()
    assert set(figures) == {"cu_airdrop_create", "cu_airdrop_update", "cu_airdrop_claim_create",
                            "cu_airdrop_claim_redeem", "cu_airdrop_withdraw"}
    assert all(0 < units <= CU_LIMIT // 10 for units in figures.values()), figures
