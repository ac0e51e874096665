"""Program ids: the pubkeys of the program keypairs committed in programs/keys/.

The ids can be overridden per cluster with PSYCHE_COORDINATOR_PROGRAM_ID,
PSYCHE_AUTHORIZER_PROGRAM_ID, PSYCHE_TREASURER_PROGRAM_ID, PSYCHE_DISTRIBUTOR_PROGRAM_ID, ...
(PSYCHE_<NAME>_PROGRAM_ID; our programs deployed
elsewhere under other keys; the coordinator program then needs a rebuild, since it
checks the authorizer id).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from solders.keypair import Keypair
from solders.pubkey import Pubkey

KEYS_DIR = Path(__file__).resolve().parent / "programs" / "keys"
PROGRAMS = ("coordinator", "authorizer", "treasurer", "distributor", "mining_pool")
SYSTEM_PROGRAM_ID = Pubkey.default()
TOKEN_PROGRAM_ID = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
ASSOCIATED_TOKEN_PROGRAM_ID = Pubkey.from_string("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")
JOIN_SCOPE = b"CoordinatorJoinRun"


def program_keypair(name: str) -> Keypair:
    return Keypair.from_json((KEYS_DIR / f"{name}-keypair.json").read_text())


@cache
def program_id(name: str) -> Pubkey:
    override = os.environ.get(f"PSYCHE_{name.upper()}_PROGRAM_ID")
    return Pubkey.from_string(override) if override else program_keypair(name).pubkey()


def coordinator_program() -> Pubkey:
    return program_id("coordinator")


def authorizer_program() -> Pubkey:
    return program_id("authorizer")


def treasurer_program() -> Pubkey:
    return program_id("treasurer")


def distributor_program() -> Pubkey:
    return program_id("distributor")


def mining_pool_program() -> Pubkey:
    return program_id("mining_pool")
