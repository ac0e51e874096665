"""Instruction builders for our three programs (wire formats: the comments at the top of
programs/coordinator.c, authorizer.c and treasurer.c).

Every builder returns a `solders.instruction.Instruction` (or a list of them when the
payload must be split to respect the 1232-byte transaction limit). Values are checked
here, so a bad argument raises `ValueError` naming it before anything is sent.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

from solders.compute_budget import set_compute_unit_limit
from solders.instruction import AccountMeta, Instruction
from solders.pubkey import Pubkey
from solders.system_program import CreateAccountParams, create_account

from coordinator import NodeIdentity, Witness
from coordinator.committee import CommitteeProof
from coordinator.config import (
    Checkpoint,
    CoordinatorConfig,
    GcsCheckpoint,
    HubCheckpoint,
    LLMConfig,
    P2PGcsCheckpoint,
)
from coordinator.state import VerificationReport
from psyche_solana.accounts import (
    CHECKPOINT_TAGS,
    CONFIG,
    CONFIG_FIELDS,
    COORDINATOR_ACCOUNT_SIZE,
    MODEL_REST_MAX,
    STRING_MAX,
)
from psyche_solana.ids import (
    ASSOCIATED_TOKEN_PROGRAM_ID,
    JOIN_SCOPE,
    SYSTEM_PROGRAM_ID,
    TOKEN_PROGRAM_ID,
    authorizer_program,
    coordinator_program,
    treasurer_program,
)

MODEL_CHUNK = 640  # bytes of model JSON per instruction: fits a transaction with room to spare


def _fixed(text: str | bytes, size: int, what: str) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > size:
        raise ValueError(f"{what} is {len(raw)} bytes, at most {size}")
    return raw.ljust(size, b"\0")


def _meta(key: Pubkey, signer: bool = False, writable: bool = False) -> AccountMeta:
    return AccountMeta(key, is_signer=signer, is_writable=writable)


# ------------------------------------------------------------------ coordinator
def create_coordinator_account(payer: Pubkey, account: Pubkey, lamports: int) -> Instruction:
    """System create_account of the run's account (the new account's keypair signs)."""
    return create_account(CreateAccountParams(
        from_pubkey=payer, to_pubkey=account, lamports=lamports,
        space=COORDINATOR_ACCOUNT_SIZE, owner=coordinator_program()))


def _coordinator(tag: int, account: Pubkey, signer: Pubkey | None, payload: bytes = b"",
                 extra: Sequence[AccountMeta] = ()) -> Instruction:
    metas = [_meta(account, writable=True)]
    if signer is not None:
        metas.append(_meta(signer, signer=True))
    return Instruction(coordinator_program(), bytes([tag]) + payload, [*metas, *extra])


def run_id_bytes(run_id: str) -> bytes:
    """The run id as the programs store it: 1-32 bytes of UTF-8 without NULs, NUL-padded."""
    raw = run_id.encode()
    if not raw or b"\0" in raw:
        raise ValueError("run_id must be 1 to 32 bytes without NUL characters")
    return _fixed(raw, 32, "run_id")


def coordinator_instance_address(run_id: str) -> Pubkey:
    """The run id's claim: the PDA ["coordinator", run_id] (Psyche's CoordinatorInstance)."""
    seed = run_id_bytes(run_id).rstrip(b"\0")
    address, _bump = Pubkey.find_program_address([b"coordinator", seed], coordinator_program())
    return address


def init_coordinator(account: Pubkey, payer: Pubkey, run_id: str, main_authority: Pubkey,
                     join_authority: Pubkey, client_version: str) -> Instruction:
    """Initialize `account` and claim `run_id` for it (the payer funds the claim)."""
    payload = (run_id_bytes(run_id) + bytes(main_authority) + bytes(join_authority)
               + _fixed(client_version, 96, "client_version"))
    return Instruction(coordinator_program(), b"\0" + payload, [
        _meta(account, writable=True), _meta(payer, True, True),
        _meta(coordinator_instance_address(run_id), writable=True), _meta(SYSTEM_PROGRAM_ID)])


def free_coordinator(account: Pubkey, authority: Pubkey, run_id: str, spill: Pubkey) -> Instruction:
    """Close a halted run: its account, its run id's claim and its metadata PDA
    (run_metadata.py's metadata_address, derived here to spare a circular import), rent to `spill`."""
    metadata, _ = Pubkey.find_program_address([b"metadata", bytes(account)], coordinator_program())
    return _coordinator(12, account, authority, b"", [_meta(coordinator_instance_address(
        run_id), writable=True), _meta(spill, writable=True), _meta(metadata, writable=True)])


def config_bytes(config: CoordinatorConfig) -> bytes:
    return CONFIG.pack(*(getattr(config, name) for name in CONFIG_FIELDS))


def update_config(account: Pubkey, authority: Pubkey, config: CoordinatorConfig) -> Instruction:
    return _coordinator(1, account, authority, b"\0" + config_bytes(config))


def model_rest_json(model: LLMConfig) -> bytes:
    rest = model.model_dump(mode="json", include={"architecture", "data_type", "data_location",
                                                  "lr_schedule", "optimizer"})
    return json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()


def checkpoint_fields(checkpoint: Checkpoint) -> tuple[int, bytes, bool, bytes]:
    tag = CHECKPOINT_TAGS.index(type(checkpoint))
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        first, second = checkpoint.bucket, checkpoint.prefix
    else:
        first, second = checkpoint.repo_id, checkpoint.revision
    return (tag, _fixed(first, STRING_MAX, "checkpoint repo"), second is not None,
            _fixed(second or "", STRING_MAX, "checkpoint revision"))


def update_model(account: Pubkey, authority: Pubkey, model: LLMConfig) -> list[Instruction]:
    """The model head (sizes, checkpoint) and its JSON rest in chunks."""
    tag, first, has_second, second = checkpoint_fields(model.checkpoint)
    head = struct.pack("<IIBB", model.max_seq_len, model.cold_start_warmup_steps, tag,
                       has_second) + first + second
    rest = model_rest_json(model)
    if len(rest) > MODEL_REST_MAX:
        raise ValueError(f"the model description is {len(rest)} bytes of JSON, at most "
                         f"{MODEL_REST_MAX}")
    out = [_coordinator(1, account, authority, b"\1" + head)]
    for offset in range(0, len(rest), MODEL_CHUNK):
        chunk = rest[offset:offset + MODEL_CHUNK]
        out.append(_coordinator(1, account, authority,
                                b"\2" + struct.pack("<II", len(rest), offset) + chunk))
    return out


def update_client_version(account: Pubkey, authority: Pubkey, version: str) -> Instruction:
    return _coordinator(1, account, authority, b"\3" + _fixed(version, 96, "client_version"))


def update_progress(account: Pubkey, authority: Pubkey, epoch: int, step: int,
                    epoch_start_data_index: int) -> Instruction:
    return _coordinator(1, account, authority,
                        b"\4" + struct.pack("<HIQ", epoch, step, epoch_start_data_index))


def update_join_authority(account: Pubkey, authority: Pubkey, join_authority: Pubkey) -> Instruction:
    return _coordinator(1, account, authority, b"\5" + bytes(join_authority))


def set_paused(account: Pubkey, authority: Pubkey, paused: bool) -> Instruction:
    return _coordinator(2, account, authority, bytes([paused]))


def accept_model_loss(account: Pubkey, authority: Pubkey) -> Instruction:
    """The run's authority accepts that its clients' newer model is lost: the run goes on
    from the stored checkpoint (coordinator.Coordinator.accept_model_loss)."""
    return _coordinator(14, account, authority)


def set_future_epoch_rates(account: Pubkey, authority: Pubkey, earning_rate_total_shared: int | None,
                           slashing_rate_per_client: int | None) -> Instruction:
    payload = struct.pack("<BQBQ", earning_rate_total_shared is not None,
                          earning_rate_total_shared or 0, slashing_rate_per_client is not None,
                          slashing_rate_per_client or 0)
    return _coordinator(3, account, authority, payload)


def join_run(account: Pubkey, client: Pubkey, authorization: Pubkey,
             replay_class: int = 0) -> Instruction:
    """Join the next epoch with the client's replay class (a u16, 0 = none; docs/
    verification.md). Class 0 is sent as the instruction without the class, byte for byte
    what older clients send, which the program reads as class 0."""
    if not 0 <= replay_class <= 0xFFFF:
        raise ValueError(f"replay_class must be a u16, got {replay_class}")
    payload = struct.pack("<H", replay_class) if replay_class else b""
    return _coordinator(4, account, client, payload, extra=[_meta(authorization)])


def tick(account: Pubkey) -> Instruction:
    return _coordinator(5, account, None)


# What an instruction gets when its transaction sends no compute-budget instruction.
DEFAULT_INSTRUCTION_COMPUTE_UNITS = 200_000

# A tick's compute budget: an instruction gets DEFAULT_INSTRUCTION_COMPUTE_UNITS unless the
# transaction asks for more, and the warm-up of a second epoch with 256 returning clients takes about 506,000
# (bench/solana_replay_classes.py: each pending key against the last epoch's clients, then
# the replay-class eligibility). Asking costs nothing without a compute-unit price.
TICK_COMPUTE_UNIT_LIMIT = 800_000


def tick_with_budget(account: Pubkey) -> list[Instruction]:
    """The instructions of a tick transaction: the compute-unit limit, then the tick."""
    return [set_compute_unit_limit(TICK_COMPUTE_UNIT_LIMIT), tick(account)]


def witness_bytes(witness: Witness) -> bytes:
    proof = witness.proof
    blooms = b"".join(struct.pack("<24Q", *bloom.words, *bloom.keys)
                      for bloom in (witness.participant_bloom, witness.broadcast_bloom))
    return (struct.pack("<QQB", proof.position, proof.index, proof.witness) + blooms
            + _fixed(witness.broadcast_merkle, 32, "broadcast_merkle"))


def warmup_witness(account: Pubkey, client: Pubkey, witness: Witness) -> Instruction:
    return _coordinator(6, account, client, witness_bytes(witness))


def witness(account: Pubkey, client: Pubkey, witness: Witness) -> Instruction:
    return _coordinator(7, account, client, witness_bytes(witness))


def health_check(account: Pubkey, client: Pubkey, target: NodeIdentity,
                 proof: CommitteeProof) -> Instruction:
    payload = target.key + struct.pack("<BQQ", int(proof.committee), proof.position, proof.index)
    return _coordinator(8, account, client, payload)


def checkpoint(account: Pubkey, client: Pubkey, index: int,
               repo: HubCheckpoint | GcsCheckpoint) -> Instruction:
    tag, first, has_second, second = checkpoint_fields(repo)
    payload = struct.pack("<QBB", index, tag, has_second) + first + second
    return _coordinator(9, account, client, payload)


VERIFICATION_REPORT = struct.Struct("<32sI32s32sIII")  # programs/coordinator_machine.h: 112 B


def verification_report(account: Pubkey, reporter: Pubkey,
                        report: VerificationReport) -> Instruction:
    """A follower's report (coordinator/verification.py); `reporter` signs and must be
    `report.reporter` (the program takes the signer as the reporter)."""
    if report.reporter.key != bytes(reporter):
        raise ValueError("report.reporter must be the signing reporter")
    for name in ("published_hash", "expected_hash"):
        if len(getattr(report, name)) != 32:
            raise ValueError(f"{name} must be 32 bytes")
    for name in ("step", "jaccard_ppm", "hamming_ppm", "manhattan_ppm"):
        if not 0 <= getattr(report, name) < 2**32:
            raise ValueError(f"{name} must be a u32, got {getattr(report, name)}")
    payload = VERIFICATION_REPORT.pack(report.accused.key, report.step, report.published_hash,
                                       report.expected_hash, report.jaccard_ppm,
                                       report.hamming_ppm, report.manhattan_ppm)
    return _coordinator(11, account, reporter, payload)


# ------------------------------------------------------------------- authorizer
def authorization_address(grantor: Pubkey, grantee: Pubkey,
                          scope: bytes = JOIN_SCOPE) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"Authorization", bytes(grantor), bytes(grantee), scope], authorizer_program())
    return address


def authorization_create(payer: Pubkey, grantor: Pubkey, grantee: Pubkey,
                         scope: bytes = JOIN_SCOPE) -> Instruction:
    if not 0 < len(scope) <= 32:
        raise ValueError("an authorization scope is 1 to 32 bytes")
    return Instruction(authorizer_program(), b"\0" + bytes(grantee) + bytes([len(scope)]) + scope, [
        _meta(payer, True, True), _meta(grantor, True),
        _meta(authorization_address(grantor, grantee, scope), writable=True),
        _meta(SYSTEM_PROGRAM_ID)])


def authorization_grantor_update(grantor: Pubkey, authorization: Pubkey, active: bool) -> Instruction:
    return Instruction(authorizer_program(), bytes([1, active]),
                       [_meta(grantor, True), _meta(authorization, writable=True)])


def authorization_grantee_update(grantee: Pubkey, authorization: Pubkey, clear: bool,
                                 added: Sequence[Pubkey] = ()) -> Instruction:
    if len(added) > 32:
        raise ValueError("at most 32 delegates")
    payload = bytes([2, clear, len(added)]) + b"".join(bytes(key) for key in added)
    return Instruction(authorizer_program(), payload,
                       [_meta(grantee, True), _meta(authorization, writable=True)])


def authorization_close(grantor: Pubkey, authorization: Pubkey, spill: Pubkey) -> Instruction:
    return Instruction(authorizer_program(), b"\3", [
        _meta(grantor, True), _meta(authorization, writable=True), _meta(spill, writable=True)])


# -------------------------------------------------------------------- treasurer
def treasurer_run_address(index: int) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"Run", index.to_bytes(8, "little")], treasurer_program())
    return address


def participant_address(run: Pubkey, user: Pubkey) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"Participant", bytes(run), bytes(user)], treasurer_program())
    return address


def associated_token_address(owner: Pubkey, mint: Pubkey) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [bytes(owner), bytes(TOKEN_PROGRAM_ID), bytes(mint)], ASSOCIATED_TOKEN_PROGRAM_ID)
    return address


def create_associated_token_account(payer: Pubkey, owner: Pubkey, mint: Pubkey) -> Instruction:
    """The ATA program's CreateIdempotent (works for PDA owners such as a treasurer run)."""
    return Instruction(ASSOCIATED_TOKEN_PROGRAM_ID, b"\1", [
        _meta(payer, True, True), _meta(associated_token_address(owner, mint), writable=True),
        _meta(owner), _meta(mint), _meta(SYSTEM_PROGRAM_ID), _meta(TOKEN_PROGRAM_ID)])


def token_transfer_checked(source: Pubkey, mint: Pubkey, destination: Pubkey, owner: Pubkey,
                           amount: int, decimals: int) -> Instruction:
    return Instruction(TOKEN_PROGRAM_ID, struct.pack("<BQB", 12, amount, decimals), [
        _meta(source, writable=True), _meta(mint), _meta(destination, writable=True),
        _meta(owner, True)])


def default_treasurer_index(run_id: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "little")


def treasurer_run_create(payer: Pubkey, index: int, coordinator_account: Pubkey, run_id: str,
                         main_authority: Pubkey, join_authority: Pubkey, client_version: str,
                         collateral_mint: Pubkey) -> Instruction:
    """Create a treasurer run; its Run PDA becomes the coordinator's main authority."""
    payload = (struct.pack("<Q", index) + run_id_bytes(run_id) + bytes(main_authority)
               + bytes(join_authority) + _fixed(client_version, 96, "client_version")
               + bytes(collateral_mint))
    return Instruction(treasurer_program(), b"\0" + payload, [
        _meta(payer, True, True), _meta(treasurer_run_address(index), writable=True),
        _meta(coordinator_account, writable=True),
        _meta(coordinator_instance_address(run_id), writable=True), _meta(coordinator_program()),
        _meta(SYSTEM_PROGRAM_ID)])


def treasurer_run_update(authority: Pubkey, index: int, coordinator_account: Pubkey,
                         inner: Instruction) -> Instruction:
    """Forward an admin coordinator instruction (update, set_paused, set_future_epoch_rates,
    accept_model_loss) built for any authority; the treasurer signs it with the Run PDA."""
    if (inner.program_id != coordinator_program()
            or inner.data[:1] not in (b"\1", b"\2", b"\3", b"\x0e")):
        raise ValueError("only update, set_paused, set_future_epoch_rates and accept_model_loss "
                         "can be forwarded")
    return Instruction(treasurer_program(), b"\1" + bytes(inner.data), [
        _meta(authority, True), _meta(treasurer_run_address(index)),
        _meta(coordinator_account, writable=True), _meta(coordinator_program())])


def treasurer_claim(user: Pubkey, index: int, coordinator_account: Pubkey, mint: Pubkey,
                    points: int) -> Instruction:
    run = treasurer_run_address(index)
    return Instruction(treasurer_program(), b"\2" + struct.pack("<Q", points), [
        _meta(user, True, True), _meta(run, writable=True), _meta(coordinator_account),
        _meta(participant_address(run, user), writable=True),
        _meta(associated_token_address(run, mint), writable=True),
        _meta(associated_token_address(user, mint), writable=True), _meta(mint),
        _meta(TOKEN_PROGRAM_ID), _meta(SYSTEM_PROGRAM_ID)])


# ------------------------------------------------------------------- SPL token
MINT_SIZE = 82


def create_mint(payer: Pubkey, mint: Pubkey, lamports: int, decimals: int,
                authority: Pubkey) -> list[Instruction]:
    """System create_account + InitializeMint2 (tag 20), no freeze authority."""
    return [create_account(CreateAccountParams(from_pubkey=payer, to_pubkey=mint,
                                               lamports=lamports, space=MINT_SIZE,
                                               owner=TOKEN_PROGRAM_ID)),
            Instruction(TOKEN_PROGRAM_ID, bytes([20, decimals]) + bytes(authority) + b"\0",
                        [_meta(mint, writable=True)])]


def mint_to(mint: Pubkey, destination: Pubkey, authority: Pubkey, amount: int) -> Instruction:
    return Instruction(TOKEN_PROGRAM_ID, struct.pack("<BQ", 7, amount), [
        _meta(mint, writable=True), _meta(destination, writable=True), _meta(authority, True)])


def token_amount(data: bytes) -> int:
    """The amount of an SPL token account (mint[32] owner[32] amount u64 ...)."""
    if len(data) < 72:
        raise ValueError("not a token account")
    return int.from_bytes(data[64:72], "little")


# ------------------------------------------------------------ P2P address directory
P2P_ADDRESS_MAX = 256


def p2p_address_account(run: Pubkey, client: Pubkey) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"p2p", bytes(run), bytes(client)], coordinator_program())
    return address


def set_p2p_address(run: Pubkey, client: Pubkey, address: str) -> Instruction:
    raw = address.encode()
    if not 0 < len(raw) <= P2P_ADDRESS_MAX:
        raise ValueError(f"a p2p address is 1 to {P2P_ADDRESS_MAX} bytes, got {len(raw)}")
    return Instruction(coordinator_program(), b"\x0a" + raw, [
        _meta(run), _meta(client, True, True),
        _meta(p2p_address_account(run, client), writable=True), _meta(SYSTEM_PROGRAM_ID)])


def decode_p2p_address(data: bytes) -> str | None:
    if len(data) != 16 + P2P_ADDRESS_MAX or data[:8] != b"PSYP2PAD":
        return None
    length = int.from_bytes(data[8:10], "little")
    try:
        return data[16:16 + min(length, P2P_ADDRESS_MAX)].decode()
    except UnicodeDecodeError:
        return None
