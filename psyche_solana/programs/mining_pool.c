/* The mining pool program: a delegate (the pool's authority) raises collateral from
 * lenders to buy compute for a run, then hands the reward tokens the run earned back to
 * the lenders in proportion to what each deposited (Psyche's solana-mining-pool program,
 * in C; psyche_solana/mining_pool.py builds its instructions and decodes its accounts).
 *
 * Accounts are byte for byte Psyche's Anchor accounts (an 8-byte discriminator
 * sha256("account:<Name>")[:8], then the fields Borsh-packed), so a tool that reads
 * Psyche's pools reads ours:
 *   Pool PDA ["Pool", index u64 LE]      (PoolAccount, 560 bytes as Anchor sizes it)
 *   Lender PDA ["Lender", pool, user]    (LenderAccount, 32 bytes)
 *   pool_collateral / pool_redeemable: the Pool PDA's associated token accounts.
 * Instructions: a 1-byte tag (as our other programs), then Psyche's Borsh params.
 *
 *   0 pool_create    [payer s w, authority s, pool w, pool_collateral w, collateral_mint,
 *                    associated_token_program, token_program, system]
 *                    index u64 | metadata {length u16, bytes[400]}
 *   1 pool_extract   [authority s, authority_collateral w, pool w, pool_collateral w,
 *                    token_program]  collateral_amount u64
 *   2 pool_update    [authority s, pool w]  Option<u64> max_deposit_collateral_amount |
 *                    Option<bool> freeze | Option<metadata>
 *   3 pool_claimable [authority s, pool w, redeemable_mint]  (no params)
 *   4 lender_create  [payer s w, user s, pool, lender w, system]  (no params)
 *   5 lender_deposit [user s, user_collateral w, pool w, pool_collateral w, lender w,
 *                    token_program]  collateral_amount u64  (refused once claims are enabled)
 *   6 lender_claim   [user s, user_redeemable w, pool w, pool_redeemable w, redeemable_mint,
 *                    lender w, token_program]  redeemable_amount u64
 *
 * A lender may claim up to floor((total_claimed + pool_redeemable balance) * deposited /
 * total_deposited) in all: the floors of the shares sum to at most what the pool ever
 * held, so claims never ask the vault for more than it has.
 */
#include "errors.h"
#include "ids.h"
#include "prelude.h"
#include "system.h"

/* Psyche's error codes (Anchor numbers custom errors from 6000), then ours. */
enum PoolError {
  E_ParamsCollateralAmountIsTooLarge = 6000, E_ParamsRedeemableAmountIsTooLarge,
  E_ParamsMetadataLengthIsTooLarge, E_PoolClaimingEnabledIsTrue, E_PoolClaimingEnabledIsFalse,
  E_PoolFreezeIsTrue, E_PoolTotalDepositedCollateralAmountIsZero,
  E_NotPoolAuthority = 6100, E_WrongLender, E_WrongPoolVault, E_WrongTokenAccount,
  E_WrongRedeemableMint, E_WrongPoolAddress,
};

#define METADATA_BYTES 400
#define POOL_SPACE 560   /* 8 + size_of::<Pool>() in Rust, which pads to 552 */
#define LENDER_SPACE 32  /* 8 + size_of::<Lender>() */

typedef struct __attribute__((packed)) {
  u8 discriminator[8]; u8 bump; u64 index; Pubkey authority;
  Pubkey collateral_mint; u64 max_deposit_collateral_amount;
  u64 total_deposited_collateral_amount; u64 total_extracted_collateral_amount;
  u8 claiming_enabled; Pubkey redeemable_mint; u64 total_claimed_redeemable_amount;
  u8 freeze; u16 metadata_length; u8 metadata_bytes[METADATA_BYTES];
} PoolAccount;
typedef struct __attribute__((packed)) {
  u8 discriminator[8]; u8 bump; u64 deposited_collateral_amount; u64 claimed_redeemable_amount;
} LenderAccount;
_Static_assert(sizeof(PoolAccount) == 549, "pool size");
_Static_assert(sizeof(LenderAccount) == 25, "lender size");

static const u8 POOL_DISCRIMINATOR[8] = {241, 154, 109, 4, 17, 177, 109, 188};
static const u8 LENDER_DISCRIMINATOR[8] = {107, 30, 175, 31, 232, 82, 180, 124};
static const Pubkey ASSOCIATED_TOKEN_PROGRAM_ID = {{
    140, 151, 37, 143, 78, 36, 137, 241, 187, 61, 16, 41, 20, 142, 13, 131,
    11, 90, 19, 153, 218, 255, 16, 132, 4, 142, 123, 216, 219, 233, 248, 89}};

static u64 load_pool(AccountInfo *a, PoolAccount **out) {
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != POOL_SPACE) return E_WrongAccountSize;
  PoolAccount *p = (PoolAccount *)a->data;
  if (!bytes_eq(p->discriminator, POOL_DISCRIMINATOR, 8)) return E_NotInitialized;
  *out = p;
  return SUCCESS;
}

/* The pool's authority signs account `signer` and `pool` is the pool, writable. */
static u64 load_admin(AccountInfo *authority, AccountInfo *pool, PoolAccount **out) {
  u64 problem = load_pool(pool, out);
  if (problem) return problem;
  if (!authority->is_signer) return E_MissingSignature;
  if (!key_eq(authority->key, &(*out)->authority)) return E_NotPoolAuthority;
  if (!pool->is_writable) return E_AccountNotWritable;
  return SUCCESS;
}

static u64 load_lender(AccountInfo *lender, AccountInfo *pool, AccountInfo *user,
                       LenderAccount **out) {
  if (!key_eq(lender->owner, CTX->program_id) || lender->data_len != LENDER_SPACE)
    return E_WrongLender;
  LenderAccount *l = (LenderAccount *)lender->data;
  if (!bytes_eq(l->discriminator, LENDER_DISCRIMINATOR, 8)) return E_WrongLender;
  Bytes seeds[4] = {{(const u8 *)"Lender", 6}, {pool->key->x, 32}, {user->key->x, 32},
                    {&l->bump, 1}};
  Pubkey address;
  if (sol_create_program_address(seeds, 4, CTX->program_id, &address) ||
      !key_eq(&address, lender->key))
    return E_WrongLender;
  *out = l;
  return SUCCESS;
}

/* `vault` is the pool's associated token account of `mint`. */
static u64 check_vault(AccountInfo *vault, AccountInfo *pool, const Pubkey *mint) {
  Bytes seeds[3] = {{pool->key->x, 32}, {TOKEN_PROGRAM_ID.x, 32}, {mint->x, 32}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 3, &ASSOCIATED_TOKEN_PROGRAM_ID, &address, &bump) ||
      !key_eq(&address, vault->key) || !key_eq(vault->owner, &TOKEN_PROGRAM_ID) ||
      vault->data_len < 72)
    return E_WrongPoolVault;
  return SUCCESS;
}

/* A token account (mint[32] owner[32] amount u64 delegate COption<Pubkey>) of `mint`,
 * owned by `owner` and with no delegate, as Psyche's constraints require. */
static u64 check_token_account(AccountInfo *a, const Pubkey *mint, const Pubkey *owner) {
  if (!key_eq(a->owner, &TOKEN_PROGRAM_ID) || a->data_len < 165 ||
      !bytes_eq(a->data, mint, 32) || !bytes_eq(a->data + 32, owner, 32) || rd_u32(a->data + 72))
    return E_WrongTokenAccount;
  return SUCCESS;
}

/* SPL Token Transfer (tag 3 | amount u64) from `from` to `to`; the Pool PDA signs when
 * `pool` is given, else `authority` signed the transaction. */
static u64 token_transfer(AccountInfo *from, AccountInfo *to, AccountInfo *authority,
                          const PoolAccount *pool, u64 amount) {
  u8 data[9];
  data[0] = 3;
  sol_memcpy_(data + 1, &amount, 8);
  AccountMeta metas[3] = {{from->key, true, false}, {to->key, true, false},
                          {authority->key, false, true}};
  Instruction ix = {(Pubkey *)&TOKEN_PROGRAM_ID, metas, 3, data, 9};
  if (pool == NULL) return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, NULL, 0);
  u8 index_le[8];
  sol_memcpy_(index_le, &pool->index, 8);
  Bytes seeds[3] = {{(const u8 *)"Pool", 4}, {index_le, 8}, {&pool->bump, 1}};
  SignerSeeds signers = {seeds, 3};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, &signers, 1);
}

/* floor(a * b / c) for b <= c without 128-bit arithmetic (BPF has no __udivti3): the
 * 128-bit product by 32-bit halves, then shift-and-subtract division. */
static u64 mul_div_floor(u64 a, u64 b, u64 c) {
  u64 a_lo = a & 0xffffffffULL, a_hi = a >> 32, b_lo = b & 0xffffffffULL, b_hi = b >> 32;
  u64 lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  u64 cross = (lo_lo >> 32) + (hi_lo & 0xffffffffULL) + lo_hi;
  u64 hi = hi_hi + (hi_lo >> 32) + (cross >> 32);
  u64 lo = (cross << 32) | (lo_lo & 0xffffffffULL);
  u64 quotient = 0, rest = 0;
  for (int i = 127; i >= 0; i--) {
    u64 top = rest >> 63;  /* rest may need 65 bits before the subtraction */
    rest = (rest << 1) | ((i >= 64 ? hi >> (i - 64) : lo >> i) & 1);
    quotient <<= 1;
    if (top || rest >= c) { rest -= c; quotient |= 1; }
  }
  return quotient;
}

static u64 pool_create(const u8 *data, u64 len) {
  if (!have_accounts(8)) return E_MissingAccount;
  AccountInfo *payer = account(0), *authority = account(1), *pool = account(2),
              *collateral = account(3), *mint = account(4);
  if (!payer->is_signer || !authority->is_signer) return E_MissingSignature;
  if (len != 8 + 2 + METADATA_BYTES) return E_InvalidInstruction;
  if (rd_u16(data + 8) > METADATA_BYTES) return E_ParamsMetadataLengthIsTooLarge;
  if (!key_eq(mint->owner, &TOKEN_PROGRAM_ID) || mint->data_len != 82) return E_WrongTokenAccount;
  Derived address = {{{(const u8 *)"Pool", 4}, {data, 8}}, 2, 0};
  if (!find_derived(&address, pool)) return E_WrongPoolAddress;
  u64 problem = create_derived(payer, pool, &address, POOL_SPACE);
  if (problem) return problem;
  PoolAccount *p = (PoolAccount *)pool->data;
  sol_memcpy_(p->discriminator, POOL_DISCRIMINATOR, 8);
  p->bump = address.bump;
  p->index = rd_u64(data);
  p->authority = *authority->key;
  p->collateral_mint = *mint->key;
  sol_memcpy_(&p->metadata_length, data + 8, 2 + METADATA_BYTES);
  /* the other fields are zero in a fresh account, as Psyche sets them. The vault is
   * created idempotently: anyone may create a wallet's associated token account, and a
   * failing Create would let them block this pool index for good. The ATA program
   * checks that `collateral` is the pool's address for the mint. */
  Pubkey system_id = {{0}};
  AccountMeta metas[6] = {{payer->key, true, true}, {collateral->key, true, false},
                          {pool->key, false, false}, {mint->key, false, false},
                          {&system_id, false, false}, {(Pubkey *)&TOKEN_PROGRAM_ID, false, false}};
  u8 create_idempotent = 1;
  Instruction ix = {(Pubkey *)&ASSOCIATED_TOKEN_PROGRAM_ID, metas, 6, &create_idempotent, 1};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, NULL, 0);
}

static u64 pool_extract(const u8 *data, u64 len) {
  if (!have_accounts(5)) return E_MissingAccount;
  AccountInfo *authority = account(0), *to = account(1), *pool = account(2), *vault = account(3);
  PoolAccount *p;
  u64 problem = load_admin(authority, pool, &p);
  if (problem) return problem;
  if (len != 8) return E_InvalidInstruction;
  if ((problem = check_token_account(to, &p->collateral_mint, authority->key))) return problem;
  if ((problem = check_vault(vault, pool, &p->collateral_mint))) return problem;
  if (p->freeze) return E_PoolFreezeIsTrue;
  u64 amount = rd_u64(data);
  p->total_extracted_collateral_amount = sat_add(p->total_extracted_collateral_amount, amount);
  return token_transfer(vault, to, pool, p, amount);
}

static u64 pool_update(const u8 *data, u64 len) {
  if (!have_accounts(2)) return E_MissingAccount;
  PoolAccount *p;
  u64 problem = load_admin(account(0), account(1), &p);
  if (problem) return problem;
  /* Borsh options: a 0/1 byte, then the value when 1; each is checked before anything
   * is written, so a malformed payload changes nothing */
  const u8 *end = data + len, *max = NULL, *freeze = NULL, *metadata = NULL;
  if (data >= end || data[0] > 1) return E_InvalidInstruction;
  if (*data++) { if (end - data < 8) return E_InvalidInstruction; max = data; data += 8; }
  if (data >= end || data[0] > 1) return E_InvalidInstruction;
  if (*data++) { if (end - data < 1 || data[0] > 1) return E_InvalidInstruction; freeze = data++; }
  if (data >= end || data[0] > 1) return E_InvalidInstruction;
  if (*data++) {
    if (end - data < 2 + METADATA_BYTES) return E_InvalidInstruction;
    metadata = data;
    data += 2 + METADATA_BYTES;
  }
  if (data != end) return E_InvalidInstruction;
  if (metadata && rd_u16(metadata) > METADATA_BYTES) return E_ParamsMetadataLengthIsTooLarge;
  if (max) p->max_deposit_collateral_amount = rd_u64(max);
  if (freeze) p->freeze = *freeze;
  if (metadata) sol_memcpy_(&p->metadata_length, metadata, 2 + METADATA_BYTES);
  return SUCCESS;
}

static u64 pool_claimable(u64 len) {
  if (!have_accounts(3)) return E_MissingAccount;
  AccountInfo *mint = account(2);
  PoolAccount *p;
  u64 problem = load_admin(account(0), account(1), &p);
  if (problem) return problem;
  if (len != 0) return E_InvalidInstruction;
  if (!key_eq(mint->owner, &TOKEN_PROGRAM_ID) || mint->data_len != 82) return E_WrongRedeemableMint;
  if (p->freeze) return E_PoolFreezeIsTrue;
  if (p->claiming_enabled) return E_PoolClaimingEnabledIsTrue;
  p->claiming_enabled = 1;
  p->redeemable_mint = *mint->key;
  p->total_claimed_redeemable_amount = 0;
  return SUCCESS;
}

static u64 lender_create(u64 len) {
  if (!have_accounts(5)) return E_MissingAccount;
  AccountInfo *payer = account(0), *user = account(1), *pool = account(2), *lender = account(3);
  PoolAccount *p;
  u64 problem = load_pool(pool, &p);
  if (problem) return problem;
  if (!payer->is_signer || !user->is_signer) return E_MissingSignature;
  if (len != 0) return E_InvalidInstruction;
  Derived address = {{{(const u8 *)"Lender", 6}, {pool->key->x, 32}, {user->key->x, 32}}, 3, 0};
  if (!find_derived(&address, lender)) return E_WrongLender;
  if ((problem = create_derived(payer, lender, &address, LENDER_SPACE))) return problem;
  LenderAccount *l = (LenderAccount *)lender->data;
  sol_memcpy_(l->discriminator, LENDER_DISCRIMINATOR, 8);
  l->bump = address.bump;
  return SUCCESS;
}

/* What a lender's instruction checks first: its first `accounts` accounts are there, the
 * pool (account 2) is one, the user (account 0) signed, and the payload is the amount. */
static u64 load_lender_call(u64 accounts, const u8 *data, u64 len, PoolAccount **pool,
                            u64 *amount) {
  if (!have_accounts(accounts)) return E_MissingAccount;
  u64 problem = load_pool(account(2), pool);
  if (problem) return problem;
  return user_amount(data, len, amount);
}

static u64 lender_deposit(const u8 *data, u64 len) {
  AccountInfo *user = account(0), *from = account(1), *pool = account(2), *vault = account(3),
              *lender = account(4);
  PoolAccount *p;
  LenderAccount *l;
  u64 amount, problem = load_lender_call(6, data, len, &p, &amount);
  if (problem) return problem;
  if ((problem = check_token_account(from, &p->collateral_mint, user->key))) return problem;
  if ((problem = check_vault(vault, pool, &p->collateral_mint))) return problem;
  if ((problem = load_lender(lender, pool, user, &l))) return problem;
  if (p->freeze) return E_PoolFreezeIsTrue;
  /* not in Psyche: a deposit once rewards are claimable would take a share of rewards
   * earned with the others' collateral */
  if (p->claiming_enabled) return E_PoolClaimingEnabledIsTrue;
  u64 total = p->total_deposited_collateral_amount + amount;
  if (total < amount || total > p->max_deposit_collateral_amount)
    return E_ParamsCollateralAmountIsTooLarge;
  if ((problem = token_transfer(from, vault, user, NULL, amount))) return problem;
  l->deposited_collateral_amount += amount;
  p->total_deposited_collateral_amount = total;
  return SUCCESS;
}

static u64 lender_claim(const u8 *data, u64 len) {
  AccountInfo *user = account(0), *to = account(1), *pool = account(2), *vault = account(3),
              *mint = account(4), *lender = account(5);
  PoolAccount *p;
  LenderAccount *l;
  u64 amount, problem = load_lender_call(7, data, len, &p, &amount);
  if (problem) return problem;
  if (p->freeze) return E_PoolFreezeIsTrue;
  if (!p->claiming_enabled) return E_PoolClaimingEnabledIsFalse;
  if (p->total_deposited_collateral_amount == 0) return E_PoolTotalDepositedCollateralAmountIsZero;
  if (!key_eq(mint->key, &p->redeemable_mint)) return E_WrongRedeemableMint;
  if ((problem = check_token_account(to, &p->redeemable_mint, user->key))) return problem;
  if ((problem = load_lender(lender, pool, user, &l))) return problem;
  if ((problem = check_vault(vault, pool, &p->redeemable_mint))) return problem;
  u64 repaid = sat_add(p->total_claimed_redeemable_amount, rd_u64(vault->data + 64));
  u64 share = mul_div_floor(repaid, l->deposited_collateral_amount,
                            p->total_deposited_collateral_amount);
  u64 claimed = l->claimed_redeemable_amount + amount;
  if (claimed < amount || claimed > share) return E_ParamsRedeemableAmountIsTooLarge;
  l->claimed_redeemable_amount = claimed;
  p->total_claimed_redeemable_amount += amount;
  return token_transfer(vault, to, pool, p, amount);
}

u64 entrypoint(u8 *input) {
  if (!deserialize(input)) return E_MissingAccount;
  if (CTX->data_len < 1) return E_InvalidInstruction;
  const u8 *data = CTX->data + 1;
  u64 len = CTX->data_len - 1;
  switch (CTX->data[0]) {
  case 0: return pool_create(data, len);
  case 1: return pool_extract(data, len);
  case 2: return pool_update(data, len);
  case 3: return pool_claimable(len);
  case 4: return lender_create(len);
  case 5: return lender_deposit(data, len);
  case 6: return lender_claim(data, len);
  default: return E_InvalidInstruction;
  }
}
