/* The distributor program: a Merkle airdrop of SPL tokens with linear vesting, with
 * Psyche's accounts, seeds, instruction encoding and leaf hash (its Anchor program
 * solana-distributor), so that a tool reading Psyche's airdrops reads ours.
 *
 * Accounts (Anchor layout: 8-byte discriminator = sha256("account:<Name>")[:8], then
 * the fields packed, little-endian):
 *   Airdrop PDA ["Airdrop", id u64 LE]: bump u8, id u64, authority[32],
 *     collateral_mint[32], total_claimed_collateral_amount u64, claim_freeze u8,
 *     merkle_root[32], metadata[300]                                    (422 bytes)
 *   Claim PDA ["Claim", airdrop, claimer, nonce u64 LE]: bump u8,
 *     claimed_collateral_amount u64                                      (17 bytes)
 *   vault: the Airdrop's associated token account of the collateral mint.
 *
 * Instructions: 8-byte discriminator sha256("global:<name>")[:8], then Borsh params.
 *   airdrop_create  [payer s w, authority s, airdrop w, vault w, mint, ata_program,
 *                   token_program, system]  id u64, merkle_root[32], metadata[300]
 *   airdrop_update  [authority s, airdrop w]  Option<bool> claim_freeze,
 *                   Option<[32]> merkle_root, Option<[300]> metadata
 *   airdrop_withdraw [authority s, receiver w, airdrop w, vault w, mint, token_program,
 *                   ata_program, system]  collateral_amount u64
 *   claim_create    [payer s w, claimer s, airdrop, claim w, system]  nonce u64
 *   claim_redeem    [claimer s, receiver w, airdrop w, vault w, mint, claim w,
 *                   token_program]  nonce u64, vesting{start i64, duration u32,
 *                   end_amount u64}, collateral_amount u64, proof Vec<[32]>
 *
 * Leaf = sha256(claimer | nonce | start | duration | end_amount) (60 bytes hashed; an
 * inner node hashes 64, so a node can never pass for a leaf); a parent is
 * sha256(min(a, b) | max(a, b)), so a proof is a plain list of siblings.
 */
#include "errors.h"
#include "ids.h"
#include "system.h"

/* The distributor's own errors, after the shared ones (psyche_solana/errors.py). */
enum DistributorError {
  E_AirdropClaimsFrozen = 300, E_WrongMerkleProof, E_MerkleRootZeroed, E_MoreThanVested,
  E_NothingVestedYet, E_NotAirdropAuthority, E_AccountingOverflow,
};

#define IX_AIRDROP_CREATE 0xc8f24b6166391336ULL
#define IX_AIRDROP_UPDATE 0x62797be8f9715dcfULL
#define IX_AIRDROP_WITHDRAW 0x22520bddc708f93bULL
#define IX_CLAIM_CREATE 0x60ac3a94dedd327bULL
#define IX_CLAIM_REDEEM 0xe2e13fa0ed890e7dULL
#define AIRDROP_DISCRIMINATOR 0xf109ed7c9e9f701fULL
#define CLAIM_DISCRIMINATOR 0x66f6d77bb016469bULL
#define METADATA_SIZE 300
#define MAX_PROOF 32

typedef struct __attribute__((packed)) {
  u64 discriminator; u8 bump; u64 id; Pubkey authority; Pubkey collateral_mint;
  u64 total_claimed_collateral_amount; u8 claim_freeze; u8 merkle_root[32];
  u8 metadata[METADATA_SIZE];
} Airdrop;
typedef struct __attribute__((packed)) {
  u64 discriminator; u8 bump; u64 claimed_collateral_amount;
} Claim;
_Static_assert(sizeof(Airdrop) == 422, "airdrop size");
_Static_assert(sizeof(Claim) == 17, "claim size");

static const Pubkey ATA_PROGRAM_ID = {{140, 151, 37, 143, 78, 36, 137, 241, 187, 61, 16, 41,
                                       20, 142, 13, 131, 11, 90, 19, 153, 218, 255, 16, 132,
                                       4, 142, 123, 216, 219, 233, 248, 89}};

static u64 load_airdrop(AccountInfo *a, Airdrop **out) {
  if (a == NULL) return E_MissingAccount;
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != sizeof(Airdrop)) return E_WrongAccountSize;
  Airdrop *airdrop = (Airdrop *)a->data;
  if (airdrop->discriminator != AIRDROP_DISCRIMINATOR) return E_NotInitialized;
  *out = airdrop;
  return SUCCESS;
}

/* A token account (mint[32] owner[32] amount u64 delegate COption ...) of the airdrop's
 * mint; `owner` (if given) must own it; no delegate, as Psyche requires of receivers. */
static bool token_account_ok(const AccountInfo *a, const Airdrop *airdrop, const Pubkey *owner) {
  if (!key_eq(a->owner, &TOKEN_PROGRAM_ID) || a->data_len < 165 || !a->is_writable) return false;
  if (!bytes_eq(a->data, &airdrop->collateral_mint, 32)) return false;
  if (owner && !bytes_eq(a->data + 32, owner, 32)) return false;
  return rd_u32(a->data + 72) == 0;
}

/* SPL Token Transfer (tag 3) of `amount` from the vault, the Airdrop PDA signing. */
static u64 pay_from_vault(const Airdrop *airdrop, AccountInfo *airdrop_account,
                          AccountInfo *vault, AccountInfo *receiver, u64 amount) {
  u8 transfer[9];
  transfer[0] = 3;
  sol_memcpy_(transfer + 1, &amount, 8);
  u8 id_le[8], bump = airdrop->bump;
  sol_memcpy_(id_le, (const u8 *)airdrop + 9, 8);
  Bytes seeds[3] = {{(const u8 *)"Airdrop", 7}, {id_le, 8}, {&bump, 1}};
  SignerSeeds signers = {seeds, 3};
  AccountMeta metas[3] = {{vault->key, true, false}, {receiver->key, true, false},
                          {airdrop_account->key, false, true}};
  Instruction ix = {(Pubkey *)&TOKEN_PROGRAM_ID, metas, 3, transfer, 9};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, &signers, 1);
}

static u64 airdrop_create(const u8 *data, u64 len) {
  AccountInfo *payer = account(0), *authority = account(1), *airdrop = account(2),
              *vault = account(3), *mint = account(4), *ata = account(5),
              *token = account(6);
  if (!account(7)) return E_MissingAccount;
  if (!payer->is_signer || !authority->is_signer) return E_MissingSignature;
  if (len != 8 + 32 + METADATA_SIZE) return E_InvalidInstruction;
  if (is_zero(data + 8, 32)) return E_MerkleRootZeroed;
  if (!key_eq(ata->key, &ATA_PROGRAM_ID) || !key_eq(token->key, &TOKEN_PROGRAM_ID) ||
      !key_eq(mint->owner, &TOKEN_PROGRAM_ID) || mint->data_len != 82)
    return E_WrongAccount;
  Bytes seeds[2] = {{(const u8 *)"Airdrop", 7}, {data, 8}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 2, CTX->program_id, &address, &bump) ||
      !key_eq(&address, airdrop->key))
    return E_WrongAccount;
  Bytes signer_seeds[3] = {seeds[0], seeds[1], {&bump, 1}};
  SignerSeeds signers = {signer_seeds, 3};
  u64 problem = create_pda_account(payer, airdrop, sizeof(Airdrop), CTX->program_id, &signers);
  if (problem) return problem;
  Airdrop *a = (Airdrop *)airdrop->data;
  a->discriminator = AIRDROP_DISCRIMINATOR;
  a->bump = bump;
  a->id = rd_u64(data);
  a->authority = *authority->key;
  a->collateral_mint = *mint->key;
  a->total_claimed_collateral_amount = 0;
  a->claim_freeze = 0;
  sol_memcpy_(a->merkle_root, data + 8, 32);
  sol_memcpy_(a->metadata, data + 40, METADATA_SIZE);
  /* the vault: the associated token account of (airdrop, mint), by the ATA program,
   * which derives and checks its address itself. CreateIdempotent: anyone can create the
   * ATA of a predictable airdrop address first, which must not block the airdrop. */
  Pubkey system_id = {{0}};
  AccountMeta metas[6] = {{payer->key, true, true}, {vault->key, true, false},
                          {airdrop->key, false, false}, {mint->key, false, false},
                          {&system_id, false, false}, {token->key, false, false}};
  const u8 create_idempotent = 1;
  Instruction ix = {(Pubkey *)&ATA_PROGRAM_ID, metas, 6, &create_idempotent, 1};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, NULL, 0);
}

/* Accounts 0 (the authority, signing) and `airdrop_index`; Psyche's has_one check. */
static u64 load_as_authority(u64 airdrop_index, Airdrop **out) {
  AccountInfo *authority = account(0);
  u64 problem = load_airdrop(account(airdrop_index), out);
  if (problem) return problem;
  if (!authority->is_signer) return E_MissingSignature;
  if (!key_eq(authority->key, &(*out)->authority)) return E_NotAirdropAuthority;
  return SUCCESS;
}

static u64 airdrop_update(const u8 *data, u64 len) {
  Airdrop *a;
  u64 problem = load_as_authority(1, &a);
  if (problem) return problem;
  /* three Borsh Options, read in turn: tag 0 (None) or 1 then the value */
  u64 at = 0;
  if (at >= len || data[at] > 1) return E_InvalidInstruction;
  bool set_freeze = data[at++];
  if (set_freeze && (at >= len || data[at] > 1)) return E_InvalidInstruction;
  u8 freeze = set_freeze ? data[at++] : 0;
  if (at >= len || data[at] > 1) return E_InvalidInstruction;
  const u8 *root = data[at++] ? data + at : NULL;
  if (root) at += 32;
  if (at >= len || data[at] > 1) return E_InvalidInstruction;
  const u8 *metadata = data[at++] ? data + at : NULL;
  if (metadata) at += METADATA_SIZE;
  if (at != len) return E_InvalidInstruction;
  if (root && is_zero(root, 32)) return E_MerkleRootZeroed;
  if (set_freeze) a->claim_freeze = freeze;
  if (root) sol_memcpy_(a->merkle_root, root, 32);
  if (metadata) sol_memcpy_(a->metadata, metadata, METADATA_SIZE);
  return SUCCESS;
}

static u64 airdrop_withdraw(const u8 *data, u64 len) {
  AccountInfo *receiver = account(1), *airdrop = account(2), *vault = account(3),
              *mint = account(4), *token = account(5);
  Airdrop *a;
  u64 problem = load_as_authority(2, &a);
  if (problem) return problem;
  if (!account(7)) return E_MissingAccount;
  if (len != 8) return E_InvalidInstruction;
  if (!key_eq(token->key, &TOKEN_PROGRAM_ID) || !key_eq(mint->key, &a->collateral_mint))
    return E_WrongAccount;
  if (!token_account_ok(vault, a, airdrop->key) || !token_account_ok(receiver, a, NULL))
    return E_WrongVault;
  return pay_from_vault(a, airdrop, vault, receiver, rd_u64(data));
}

static u64 claim_create(const u8 *data, u64 len) {
  AccountInfo *payer = account(0), *claimer = account(1), *airdrop = account(2),
              *claim = account(3);
  Airdrop *a;
  u64 problem = load_airdrop(airdrop, &a);
  if (problem) return problem;
  if (!account(4)) return E_MissingAccount;
  if (!payer->is_signer || !claimer->is_signer) return E_MissingSignature;
  if (len != 8) return E_InvalidInstruction;
  if (a->claim_freeze) return E_AirdropClaimsFrozen;
  Bytes seeds[4] = {{(const u8 *)"Claim", 5}, {airdrop->key->x, 32}, {claimer->key->x, 32},
                    {data, 8}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 4, CTX->program_id, &address, &bump) ||
      !key_eq(&address, claim->key))
    return E_WrongAccount;
  Bytes signer_seeds[5] = {seeds[0], seeds[1], seeds[2], seeds[3], {&bump, 1}};
  SignerSeeds signers = {signer_seeds, 5};
  problem = create_pda_account(payer, claim, sizeof(Claim), CTX->program_id, &signers);
  if (problem) return problem;
  Claim *c = (Claim *)claim->data;
  c->discriminator = CLAIM_DISCRIMINATOR;
  c->bump = bump;
  c->claimed_collateral_amount = 0;
  return SUCCESS;
}

/* floor(end * elapsed / duration) without 128-bit arithmetic (clang's BPF target has no
 * __multi3): end = q * duration + r, and r * elapsed < 2^64 since both are < 2^32. */
static u64 vested_amount(i64 start, u32 duration, u64 end, i64 now) {
  if (now < start) return 0;
  if (duration == 0) return end;
  u64 elapsed = (u64)now - (u64)start;
  if (elapsed >= duration) return end;
  u64 q = end / duration, r = end % duration;
  return q * elapsed + r * elapsed / duration;
}

/* Walk `count` proof nodes up from `leaf`; true when the result is `root`. */
static bool proof_matches(const u8 *leaf, const u8 *proof, u32 count, const u8 *root) {
  u8 node[32];
  sol_memcpy_(node, leaf, 32);
  for (u32 i = 0; i < count; i++) {
    const u8 *sibling = proof + 32 * i;
    int order = 0;
    sol_memcmp_(node, sibling, 32, &order);
    Bytes pair[2] = {{order <= 0 ? node : sibling, 32}, {order <= 0 ? sibling : node, 32}};
    u8 parent[32];
    sol_sha256(pair, 2, parent);
    sol_memcpy_(node, parent, 32);
  }
  return bytes_eq(node, root, 32);
}

static u64 claim_redeem(const u8 *data, u64 len) {
  AccountInfo *claimer = account(0), *receiver = account(1), *airdrop = account(2),
              *vault = account(3), *mint = account(4), *claim = account(5),
              *token = account(6);
  Airdrop *a;
  u64 problem = load_airdrop(airdrop, &a);
  if (problem) return problem;
  if (!token) return E_MissingAccount;
  if (!claimer->is_signer) return E_MissingSignature;
  /* nonce 8 | start 8 | duration 4 | end 8 | amount 8 | proof count 4 | proof */
  if (len < 40) return E_InvalidInstruction;
  u32 count = rd_u32(data + 36);
  if (count > MAX_PROOF || len != 40 + 32ULL * count) return E_InvalidInstruction;
  if (a->claim_freeze) return E_AirdropClaimsFrozen;
  if (!key_eq(token->key, &TOKEN_PROGRAM_ID) || !key_eq(mint->key, &a->collateral_mint))
    return E_WrongAccount;
  if (!token_account_ok(vault, a, airdrop->key) || !token_account_ok(receiver, a, NULL))
    return E_WrongVault;
  if (!key_eq(claim->owner, CTX->program_id) || claim->data_len != sizeof(Claim) ||
      ((Claim *)claim->data)->discriminator != CLAIM_DISCRIMINATOR)
    return E_WrongAccount;
  Claim *c = (Claim *)claim->data;
  u8 bump = c->bump;
  Bytes seeds[5] = {{(const u8 *)"Claim", 5}, {airdrop->key->x, 32}, {claimer->key->x, 32},
                    {data, 8}, {&bump, 1}};
  Pubkey address;
  if (sol_create_program_address(seeds, 5, CTX->program_id, &address) ||
      !key_eq(&address, claim->key))
    return E_WrongAccount;
  Bytes leaf_parts[2] = {{claimer->key->x, 32}, {data, 28}};
  u8 leaf[32];
  sol_sha256(leaf_parts, 2, leaf);
  if (!proof_matches(leaf, data + 40, count, a->merkle_root)) return E_WrongMerkleProof;
  u64 vested = vested_amount((i64)rd_u64(data + 8), rd_u32(data + 16), rd_u64(data + 20),
                             now_clock().unix_timestamp);
  u64 claimed = c->claimed_collateral_amount, amount = rd_u64(data + 28);
  u64 claimable = vested > claimed ? vested - claimed : 0;
  if (amount > claimable) return vested == 0 ? E_NothingVestedYet : E_MoreThanVested;
  u64 total = a->total_claimed_collateral_amount;
  if (total + amount < total) return E_AccountingOverflow;
  c->claimed_collateral_amount = claimed + amount;
  a->total_claimed_collateral_amount = total + amount;
  return pay_from_vault(a, airdrop, vault, receiver, amount);
}

u64 entrypoint(u8 *input) {
  if (!deserialize(input)) return E_MissingAccount;
  if (CTX->data_len < 8) return E_InvalidInstruction;
  const u8 *data = CTX->data + 8;
  u64 len = CTX->data_len - 8;
  if (CTX->num_accounts < 2) return E_MissingAccount;
  switch (rd_u64(CTX->data)) {
  case IX_AIRDROP_CREATE: return airdrop_create(data, len);
  case IX_AIRDROP_UPDATE: return airdrop_update(data, len);
  case IX_AIRDROP_WITHDRAW: return airdrop_withdraw(data, len);
  case IX_CLAIM_CREATE: return claim_create(data, len);
  case IX_CLAIM_REDEEM: return claim_redeem(data, len);
  default: return E_InvalidInstruction;
  }
}
