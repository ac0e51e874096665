/* The treasurer program: runs whose main authority is a treasurer PDA, and rewards in
 * an SPL token at 1 base unit per earned point (docs/solana.md, "Treasurer").
 *
 *   Run PDA ["Run", index u64 LE]            (RunAccount below)
 *   Participant PDA ["Participant", run, user] (ParticipantAccount)
 *   reward vault: any token account of the collateral mint owned by the Run PDA (its
 *   associated token account by convention); top-ups are plain token transfers.
 *
 *   0 run_create  [payer s w, run w, coordinator_account w, coordinator_instance w,
 *                 coordinator_program, system]
 *                 index u64 run_id[32] main_authority[32] join_authority[32]
 *                 client_version[96] collateral_mint[32]
 *                 -> CPI coordinator init_coordinator with the Run PDA as main authority
 *                 (which claims the run id: coordinator_instance is its PDA)
 *   1 run_update  [main_authority s, run, coordinator_account w, coordinator_program]
 *                 a coordinator instruction (update | set_paused | set_future_epoch_rates),
 *                 forwarded with the Run PDA signing
 *   2 participant_claim [user s w, run w, coordinator_account, participant w, vault w,
 *                 user_token w, mint, token_program, system]  points u64
 *                 claimable = earned (coordinator ledger) - claimed; never twice
 *   3 run_set_metadata [main_authority s w, run, coordinator_account, metadata w,
 *                 coordinator_program, system]  the coordinator's set_run_metadata payload
 *                 -> CPI set_run_metadata signed by the Run PDA, the main authority paying
 *   4 run_close   [main_authority s w, run, coordinator_account w, coordinator_instance w,
 *                 metadata w, coordinator_program]  (no payload)
 *                 -> CPI free_coordinator signed by the Run PDA, the rent to the main
 *                 authority. The Run PDA and its vault stay: once the coordinator is gone,
 *                 points not yet claimed can no longer be claimed.
 */
#include "coordinator_layout.h"
#include "errors.h"
#include "ids.h"
#include "prelude.h"
#include "system.h"

typedef struct {
  u8 magic[8]; u8 bump; u8 pad[7]; u64 index;
  Pubkey main_authority; Pubkey join_authority; Pubkey coordinator_account; Pubkey collateral_mint;
  u64 total_claimed_collateral_amount; u64 total_claimed_earned_points;
} RunAccount;
typedef struct {
  u8 magic[8]; u8 bump; u8 pad[7]; u64 claimed_collateral_amount; u64 claimed_earned_points;
} ParticipantAccount;
_Static_assert(sizeof(RunAccount) == 168, "run size");
_Static_assert(sizeof(ParticipantAccount) == 32, "participant size");

static const u8 RUN_MAGIC[8] = {'P', 'S', 'Y', 'T', 'R', 'R', 'U', 'N'};
static const u8 PARTICIPANT_MAGIC[8] = {'P', 'S', 'Y', 'T', 'P', 'A', 'R', 'T'};

static u64 run_create(const u8 *data, u64 len) {
  AccountInfo *payer = account(0), *run = account(1), *coordinator = account(2),
              *instance = account(3);
  if (!have_accounts(6)) return E_MissingAccount;
  if (!payer->is_signer) return E_MissingSignature;
  if (len != 8 + 32 * 3 + 96 + 32) return E_InvalidInstruction;
  Derived address = {{{(const u8 *)"Run", 3}, {data, 8}}, 2, 0};
  if (!find_derived(&address, run)) return E_WrongAccount;
  u64 problem = create_derived(payer, run, &address, sizeof(RunAccount));
  if (problem) return problem;
  RunAccount *r = (RunAccount *)run->data;
  sol_memcpy_(r->magic, RUN_MAGIC, 8);
  r->bump = address.bump;
  r->index = rd_u64(data);
  sol_memcpy_(&r->main_authority, data + 40, 32);
  sol_memcpy_(&r->join_authority, data + 72, 32);
  r->coordinator_account = *coordinator->key;
  sol_memcpy_(&r->collateral_mint, data + 200, 32);
  /* init_coordinator: run_id | main_authority = Run PDA | join_authority | client_version */
  u8 *init = heap_alloc(1 + 32 * 3 + 96);
  if (init == NULL) return E_InvalidInstruction;
  init[0] = 0;
  sol_memcpy_(init + 1, data + 8, 32);
  sol_memcpy_(init + 33, run->key, 32);
  sol_memcpy_(init + 65, data + 72, 32);
  sol_memcpy_(init + 97, data + 104, 96);
  Pubkey system_id = {{0}};
  AccountMeta metas[4] = {{coordinator->key, true, false}, {payer->key, true, true},
                          {instance->key, true, false}, {&system_id, false, false}};
  Instruction ix = {(Pubkey *)&COORDINATOR_ID, metas, 4, init, 1 + 32 * 3 + 96};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, NULL, 0);
}

static u64 load_run(AccountInfo *a, RunAccount **out) {
  if (a == NULL) return E_MissingAccount;
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != sizeof(RunAccount)) return E_WrongAccountSize;
  RunAccount *r = (RunAccount *)a->data;
  if (!bytes_eq(r->magic, RUN_MAGIC, 8)) return E_NotInitialized;
  *out = r;
  return SUCCESS;
}

/* The run's main authority signs `accounts` 0 and names this run's coordinator as 2; the
 * first `accounts` accounts must be there. */
static u64 load_admin(u64 accounts, RunAccount **out) {
  AccountInfo *authority = account(0), *coordinator = account(2);
  u64 problem = load_run(account(1), out);
  if (problem) return problem;
  if (accounts == 0 || !have_accounts(accounts)) return E_MissingAccount;
  if (!authority->is_signer) return E_MissingSignature;
  if (!key_eq(authority->key, &(*out)->main_authority)) return E_NotMainAuthority;
  if (!key_eq(coordinator->key, &(*out)->coordinator_account)) return E_WrongAccount;
  return SUCCESS;
}

/* Invoke the coordinator with `data` on `metas`, the Run PDA (account 1) signing. */
static u64 invoke_as_run(const RunAccount *r, AccountMeta *metas, u64 n, const u8 *data,
                         u64 len) {
  u8 index_le[8];
  sol_memcpy_(index_le, &r->index, 8);
  Bytes seeds[3] = {{(const u8 *)"Run", 3}, {index_le, 8}, {(const u8 *)&r->bump, 1}};
  SignerSeeds signers = {seeds, 3};
  Instruction ix = {(Pubkey *)&COORDINATOR_ID, metas, n, data, len};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, &signers, 1);
}

static u64 run_update(const u8 *data, u64 len) {
  RunAccount *r;
  u64 problem = load_admin(4, &r);
  if (problem) return problem;
  /* update, set_paused, set_future_epoch_rates, accept_model_loss */
  if (len < 1 || ((data[0] < 1 || data[0] > 3) && data[0] != 14)) return E_NotAdminInstruction;
  AccountMeta metas[2] = {{account(2)->key, true, false}, {account(1)->key, false, true}};
  return invoke_as_run(r, metas, 2, data, len);
}

static u64 run_set_metadata(const u8 *data, u64 len) {
  RunAccount *r;
  u64 problem = load_admin(6, &r);
  if (problem) return problem;
  u8 *forwarded = heap_alloc(1 + len);
  if (forwarded == NULL) return E_InvalidInstruction;
  forwarded[0] = 13;
  sol_memcpy_(forwarded + 1, data, len);
  Pubkey system_id = {{0}};
  AccountMeta metas[5] = {{account(2)->key, false, false}, {account(1)->key, false, true},
                          {account(0)->key, true, true}, {account(3)->key, true, false},
                          {&system_id, false, false}};
  return invoke_as_run(r, metas, 5, forwarded, 1 + len);
}

static u64 run_close(u64 len) {
  RunAccount *r;
  u64 problem = load_admin(6, &r);
  if (problem) return problem;
  if (len != 0) return E_InvalidInstruction;
  u8 free_coordinator = 12;
  AccountMeta metas[5] = {{account(2)->key, true, false}, {account(1)->key, false, true},
                          {account(3)->key, true, false}, {account(0)->key, true, false},
                          {account(4)->key, true, false}};
  return invoke_as_run(r, metas, 5, &free_coordinator, 1);
}

static u64 earned_points(const CoordinatorAccount *c, const Pubkey *user) {
  for (u32 i = 0; i < c->rewards_len && i < MAX_CLIENTS; i++)
    if (key_eq(&c->rewards[i].id, user)) return c->rewards[i].earned;
  return 0;
}

static u64 participant_claim(const u8 *data, u64 len) {
  AccountInfo *user = account(0), *run = account(1), *coordinator = account(2),
              *participant = account(3), *vault = account(4), *user_token = account(5),
              *mint = account(6);
  RunAccount *r;
  u64 problem = load_run(run, &r);
  if (problem) return problem;
  if (!have_accounts(9)) return E_MissingAccount;
  u64 points;
  if ((problem = user_amount(data, len, &points))) return problem;
  if (!key_eq(coordinator->key, &r->coordinator_account) ||
      !key_eq(coordinator->owner, &COORDINATOR_ID) ||
      coordinator->data_len != sizeof(CoordinatorAccount))
    return E_WrongAccount;
  /* vault: a token account (mint[32] owner[32] amount u64 ...) of the run's mint, owned
   * by the Run PDA */
  if (!key_eq(vault->owner, &TOKEN_PROGRAM_ID) || vault->data_len < 72 ||
      !bytes_eq(vault->data, &r->collateral_mint, 32) || !bytes_eq(vault->data + 32, run->key, 32) ||
      !key_eq(mint->key, &r->collateral_mint) || mint->data_len < 45)
    return E_WrongVault;
  Derived address = {
      {{(const u8 *)"Participant", 11}, {run->key->x, 32}, {user->key->x, 32}}, 3, 0};
  if (!find_derived(&address, participant)) return E_WrongAccount;
  if (!key_eq(participant->owner, CTX->program_id)) {
    problem = create_derived(user, participant, &address, sizeof(ParticipantAccount));
    if (problem) return problem;
    ParticipantAccount *p = (ParticipantAccount *)participant->data;
    sol_memcpy_(p->magic, PARTICIPANT_MAGIC, 8);
    p->bump = address.bump;
  }
  if (!key_eq(participant->owner, CTX->program_id) ||
      participant->data_len != sizeof(ParticipantAccount))
    return E_WrongAccount;
  ParticipantAccount *p = (ParticipantAccount *)participant->data;
  u64 earned = earned_points((const CoordinatorAccount *)coordinator->data, user->key);
  u64 claimable = earned - p->claimed_earned_points;
  if (claimable == 0 || points == 0) return E_NothingToClaim;
  if (points > claimable) return E_ClaimTooLarge;
  /* TransferChecked: tag 12 | amount u64 | decimals u8; 1 base unit per point */
  u8 transfer[10];
  transfer[0] = 12;
  sol_memcpy_(transfer + 1, &points, 8);
  transfer[9] = mint->data[44];
  u8 index_le[8];
  sol_memcpy_(index_le, &r->index, 8);
  Bytes run_seeds[3] = {{(const u8 *)"Run", 3}, {index_le, 8}, {&r->bump, 1}};
  SignerSeeds signers = {run_seeds, 3};
  AccountMeta metas[4] = {{vault->key, true, false}, {mint->key, false, false},
                          {user_token->key, true, false}, {run->key, false, true}};
  Instruction ix = {(Pubkey *)&TOKEN_PROGRAM_ID, metas, 4, transfer, 10};
  problem = sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, &signers, 1);
  if (problem) return problem;
  p->claimed_earned_points += points;
  p->claimed_collateral_amount += points;
  r->total_claimed_earned_points += points;
  r->total_claimed_collateral_amount += points;
  return SUCCESS;
}

u64 entrypoint(u8 *input) {
  if (!deserialize(input)) return E_MissingAccount;
  if (CTX->data_len < 1) return E_InvalidInstruction;
  const u8 *data = CTX->data + 1;
  u64 len = CTX->data_len - 1;
  switch (CTX->data[0]) {
  case 0: return run_create(data, len);
  case 1: return run_update(data, len);
  case 2: return participant_claim(data, len);
  case 3: return run_set_metadata(data, len);
  case 4: return run_close(len);
  default: return E_InvalidInstruction;
  }
}
