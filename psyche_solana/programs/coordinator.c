/* The Psyche coordinator program: one program-owned account per run holding the state
 * machine of coordinator/ (see coordinator_layout.h), driven by instructions.
 *
 * Instruction data = tag u8 | payload (little-endian, packed):
 *   0 init_coordinator  [account w, payer s w, instance w, system]  run_id[32]
 *                       main_authority[32] join_authority[32] client_version[96]
 *                       also creates the run id's claim `instance`, the PDA
 *                       ["coordinator", run_id up to its first NUL] naming `account`
 *                       (coordinator_layout.h): a run id is taken once, ever
 *   1 update            [account w, main_authority s]  kind u8 | payload (update_run)
 *   2 set_paused        [account w, main_authority s]  paused u8 (0 = resume)
 *   3 set_future_epoch_rates [account w, main_authority s]
 *                       has_earning u8 earning u64 has_slashing u8 slashing u64
 *   4 join_run          [account w, client s, authorization]  [replay_class u16]
 *                       the client's replay class (0 = none, also when absent, as older
 *                       clients send it), kept in its registry entry until the warm-up
 *                       copies it into its Client entry (the follow plan groups by it)
 *   5 tick              [account w]                   (anyone; the fee payer signs)
 *   6 warmup_witness    [account w, client s]  witness (433 B, coordinator_machine.h)
 *   7 witness           [account w, client s]  witness
 *   8 health_check      [account w, client s]  target[32] committee u8 position u64 index u64
 *   9 checkpoint        [account w, client s]  index u64 tag u8 has_second u8 first[64] second[64]
 *  10 set_p2p_address   [account, client s w, p2p PDA w, system]  address (1-256 B)
 *                       the client's P2P address, in the PDA ["p2p", account, client]
 *                       (a directory beside the state; it does not touch the state)
 *  11 verification_report [account w, reporter s]  accused[32] step u32 published_hash[32]
 *                       expected_hash[32] jaccard_ppm u32 hamming_ppm u32 manhattan_ppm u32
 *                       a follower's report (coordinator_machine.h, coordinator/verification.py)
 *  12 free_coordinator  [account w, main_authority s, instance w, spill w, metadata w]
 *                       (no payload) Psyche's free_coordinator: a halted run (Uninitialized,
 *                       Paused or Finished) is closed, its account, its run id's claim and
 *                       its metadata PDA (if set) zeroed and their lamports (the rent) sent
 *                       to `spill`; the id is free again
 *  13 set_run_metadata  [account, main_authority s, payer s w, metadata PDA w, system]
 *                       Psyche's RunMetadata, in the PDA ["metadata", account]
 *                       (run_metadata.h: payload, rules)
 *  14 accept_model_loss [account w, main_authority s]  (no payload) the authority accepts
 *                       that the clients' newer model is lost: the run, waiting for a
 *                       holder (model_lost) or paused, goes on from the stored checkpoint
 * now = the Clock's unix_timestamp; seed = u64_le(SHA-256(unix_timestamp_i64_le ||
 * slot_u64_le)[0:8]) (docs/coordinator.md, "Seeds"). Events do not tick: clients send
 * tick transactions.
 */
#include "coordinator_machine.h"
#include "errors.h"
#include "ids.h"

#define JOIN_SCOPE "CoordinatorJoinRun"
#include "authorization_layout.h"
#include "system.h"
#include "run_metadata.h"

#define P2P_ADDRESS_MAX 256
typedef struct { u8 magic[8]; u16 len; u8 pad[6]; u8 address[P2P_ADDRESS_MAX]; } P2PAddress;
static const u8 P2P_MAGIC[8] = {'P', 'S', 'Y', 'P', '2', 'P', 'A', 'D'};

static u64 set_p2p_address(const u8 *data, u64 len) {
  AccountInfo *run = account(0), *client = account(1), *entry = account(2);
  if (!run || !client || !entry || !account(3)) return E_MissingAccount;
  if (!client->is_signer) return E_MissingSignature;
  if (!key_eq(run->owner, CTX->program_id) || run->data_len != sizeof(State)) return E_WrongAccount;
  if (len == 0 || len > P2P_ADDRESS_MAX) return E_InvalidInstruction;
  Bytes seeds[3] = {{(const u8 *)"p2p", 3}, {run->key->x, 32}, {client->key->x, 32}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 3, CTX->program_id, &address, &bump) ||
      !key_eq(&address, entry->key))
    return E_WrongAccount;
  if (!key_eq(entry->owner, CTX->program_id)) {
    Bytes signer_seeds[4] = {seeds[0], seeds[1], seeds[2], {&bump, 1}};
    SignerSeeds signers = {signer_seeds, 4};
    u64 problem = create_pda_account(client, entry, sizeof(P2PAddress), CTX->program_id, &signers);
    if (problem) return problem;
  }
  if (!key_eq(entry->owner, CTX->program_id) || entry->data_len != sizeof(P2PAddress))
    return E_WrongAccount;
  P2PAddress *p = (P2PAddress *)entry->data;
  sol_memcpy_(p->magic, P2P_MAGIC, 8);
  p->len = (u16)len;
  sol_memset_(p->address, 0, P2P_ADDRESS_MAX);
  sol_memcpy_(p->address, data, len);
  return SUCCESS;
}

static u64 seed_of(const Clock *clock) {
  u8 digest[32];
  sha256_2((const u8 *)&clock->unix_timestamp, 8, (const u8 *)&clock->slot, 8, digest);
  return rd_u64(digest);
}

static u64 load_state(AccountInfo *a, State **out) {
  if (a == NULL) return E_MissingAccount;
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != sizeof(State)) return E_WrongAccountSize;
  if (!a->is_writable) return E_AccountNotWritable;
  State *s = (State *)a->data;
  if (!bytes_eq(s->magic, COORDINATOR_MAGIC, 8)) return E_NotInitialized;
  *out = s;
  return SUCCESS;
}

static u64 signer(u64 index, const Pubkey **out) {
  AccountInfo *a = account(index);
  if (a == NULL) return E_MissingAccount;
  if (!a->is_signer) return E_MissingSignature;
  *out = a->key;
  return SUCCESS;
}

/* A run id is 1-32 bytes, NUL-padded: nothing but NULs after the first NUL, so that the
 * claim's seed (the bytes before it) names exactly one stored run id. */
static u64 run_id_length(const u8 *run_id, u64 *out) {
  u64 n = 0;
  while (n < 32 && run_id[n]) n++;
  if (n == 0 || !is_zero(run_id + n, 32 - n)) return E_InvalidRunId;
  *out = n;
  return SUCCESS;
}

/* Claim the run id: create its instance PDA (AlreadyInitialized if it exists: the id is
 * taken) naming `account`. */
static u64 claim_run_id(AccountInfo *account, AccountInfo *payer, AccountInfo *instance,
                        const u8 *run_id) {
  u64 n, problem;
  if ((problem = run_id_length(run_id, &n))) return problem;
  Bytes seeds[2] = {{(const u8 *)INSTANCE_SEED, sizeof(INSTANCE_SEED) - 1}, {run_id, n}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 2, CTX->program_id, &address, &bump) ||
      !key_eq(&address, instance->key))
    return E_WrongAccount;
  Bytes signer_seeds[3] = {seeds[0], seeds[1], {&bump, 1}};
  SignerSeeds signers = {signer_seeds, 3};
  problem = create_pda_account(payer, instance, sizeof(CoordinatorInstance), CTX->program_id,
                               &signers);
  if (problem) return problem;
  CoordinatorInstance *claim = (CoordinatorInstance *)instance->data;
  sol_memcpy_(claim->magic, INSTANCE_MAGIC, 8);
  claim->bump = bump;
  claim->coordinator_account = *account->key;
  sol_memcpy_(claim->run_id, run_id, 32);
  return SUCCESS;
}

static u64 init_coordinator(const u8 *data, u64 len) {
  if (len != 32 * 3 + 96) return E_InvalidInstruction;
  AccountInfo *a = account(0), *payer = account(1), *instance = account(2);
  if (a == NULL || payer == NULL || instance == NULL || account(3) == NULL)
    return E_MissingAccount;
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != sizeof(State)) return E_WrongAccountSize;
  if (!a->is_writable) return E_AccountNotWritable;
  if (!payer->is_signer) return E_MissingSignature;
  State *s = (State *)a->data;
  if (!is_zero(s->magic, 8)) return E_AlreadyInitialized;
  u64 problem = claim_run_id(a, payer, instance, data);
  if (problem) return problem;
  sol_memcpy_(s->magic, COORDINATOR_MAGIC, 8);
  s->version = ACCOUNT_VERSION;
  sol_memcpy_(s->run_id, data, 32);
  sol_memcpy_(&s->main_authority, data + 32, 32);
  sol_memcpy_(&s->join_authority, data + 64, 32);
  sol_memcpy_(s->client_version, data + 96, 96);
  s->run_state = Uninitialized;
  s->step = 1;
  s->first_round = 1;
  return SUCCESS;
}

/* coordinator/config.py coordinator_config_errors, rule for rule. */
static bool config_valid(const Config *c) {
  return c->epoch_time > 0 && c->warmup_time < c->epoch_time && c->cooldown_time > 0 &&
         c->max_round_train_time > 0 && c->max_round_train_time < c->epoch_time &&
         c->round_witness_time > 0 && c->total_steps > 0 && c->min_clients > 0 &&
         c->min_clients <= MAX_CLIENTS && c->init_min_clients >= c->min_clients &&
         c->init_min_clients <= MAX_CLIENTS && c->witness_nodes <= MAX_WITNESSES &&
         c->witness_nodes <= c->min_clients && c->global_batch_size_start > 0 &&
         c->global_batch_size_end >= c->global_batch_size_start &&
         c->verification_percent <= 100 && c->waiting_for_members_extra_time > 0;
}

/* update kinds: 0 config (64 B, Config) | 1 model head: max_seq_len u32 cold_start u32
 * tag u8 has_second u8 first[64] second[64] | 2 model JSON chunk: total u32 offset u32 bytes
 * | 3 client_version[96] | 4 progress: epoch u16 step u32 epoch_start_data_index u64
 * | 5 join_authority[32] */
static u64 update_run(State *s, const u8 *data, u64 len) {
  if (len < 1) return E_InvalidInstruction;
  u8 kind = data[0];
  data += 1; len -= 1;
  if (kind == 3) {
    if (!halted(s)) return E_NotHalted;
    if (len != 96) return E_InvalidInstruction;
    sol_memcpy_(s->client_version, data, 96);
    return SUCCESS;
  }
  if (s->run_state != Uninitialized && s->run_state != Paused) return E_NotHalted;
  if (kind == 0) {
    Config config;
    if (len != sizeof(Config)) return E_InvalidInstruction;
    sol_memcpy_(&config, data, sizeof(Config));
    if (!config_valid(&config)) return E_InvalidConfig;
    s->config = config;
    s->config_set = 1;
  } else if (kind == 1) {
    if (len != 138) return E_InvalidInstruction;
    u32 max_seq_len = rd_u32(data);
    if (max_seq_len == 0 || data[8] > CkP2PGcs) return E_InvalidModel;
    s->model.max_seq_len = max_seq_len;
    s->model.cold_start_warmup_steps = rd_u32(data + 4);
    s->model.checkpoint_tag = data[8];
    s->model.has_second = data[9] != 0;
    sol_memcpy_(s->model.first, data + 10, 2 * STRING_MAX);
    s->model_set |= 1;
  } else if (kind == 2) {
    if (len < 8) return E_InvalidInstruction;
    u32 total = rd_u32(data), offset = rd_u32(data + 4);
    u64 chunk = len - 8;
    if (total == 0 || total > MODEL_REST_MAX || offset > total || chunk > total - offset)
      return E_InvalidModel;
    if (offset == 0) { s->model_set &= ~2; s->model.rest_len = total; }
    if (total != s->model.rest_len) return E_InvalidModel;
    sol_memcpy_(s->model.rest + offset, data + 8, chunk);
    if (offset + chunk == total) s->model_set |= 2;
  } else if (kind == 4) {
    if (len != 14) return E_InvalidInstruction;
    u32 step = rd_u32(data + 2);
    if (step == 0) return E_InvalidConfig;
    s->epoch = rd_u16(data);
    s->step = step;
    s->epoch_start_data_index = rd_u64(data + 6);
  } else if (kind == 5) {
    if (len != 32) return E_InvalidInstruction;
    sol_memcpy_(&s->join_authority, data, 32);
  } else {
    return E_InvalidInstruction;
  }
  return SUCCESS;
}

static u64 set_rates(State *s, const u8 *data, u64 len) {
  if (len != 18) return E_InvalidInstruction;
  if (data[0]) s->future_earning_rate_total_shared = rd_u64(data + 1);
  if (data[9]) s->future_slashing_rate_per_client = rd_u64(data + 10);
  return SUCCESS;
}

/* resume also checks what Python's state file loader checks: a full, valid config. */
static u64 set_paused(State *s, const u8 *data, u64 len, u64 now) {
  if (len != 1) return E_InvalidInstruction;
  if (data[0]) return pause(s, now);
  if (s->run_state != Paused && s->run_state != Uninitialized) return E_CannotResume;
  if (!s->config_set || !config_valid(&s->config)) return E_InvalidConfig;
  if (s->model_set != 3) return E_ModelNotSet;
  const Config *c = &s->config;
  if (s->model.cold_start_warmup_steps > (c->epoch_time - c->warmup_time) / c->max_round_train_time)
    return E_InvalidConfig;
  return resume(s, now);
}

/* Valid for `client` iff active, granted by the run's join authority for the join scope,
 * and the grantee is the zero key (permissionless), the client, or lists it as delegate. */
static u64 check_authorization(const State *s, const Pubkey *client, AccountInfo *a) {
  if (a == NULL) return E_MissingAccount;
  if (!key_eq(a->owner, &AUTHORIZER_ID)) return E_NotAuthorized;
  if (a->data_len != sizeof(Authorization)) return E_NotAuthorized;
  const Authorization *auth = (const Authorization *)a->data;
  if (!bytes_eq(auth->magic, AUTHORIZATION_MAGIC, 8) || !auth->active) return E_NotAuthorized;
  if (!key_eq(&auth->grantor, &s->join_authority)) return E_NotAuthorized;
  if (auth->scope_len != sizeof(JOIN_SCOPE) - 1 ||
      !bytes_eq(auth->scope, JOIN_SCOPE, sizeof(JOIN_SCOPE) - 1))
    return E_NotAuthorized;
  Pubkey expected;
  if (authorization_address(auth, &AUTHORIZER_ID, &expected) || !key_eq(&expected, a->key))
    return E_NotAuthorized;
  if (is_zero(auth->grantee.x, 32) || key_eq(&auth->grantee, client)) return SUCCESS;
  for (u32 i = 0; i < auth->delegates_len && i < MAX_DELEGATES; i++)
    if (key_eq(&auth->delegates[i], client)) return SUCCESS;
  return E_NotAuthorized;
}

/* data: nothing (class 0) or replay_class u16 */
static u64 join_run(State *s, const Pubkey *client, const u8 *data, u64 len) {
  if (len != 0 && len != 2) return E_InvalidInstruction;
  u16 replay_class = len == 2 ? rd_u16(data) : 0;
  u64 problem = check_authorization(s, client, account(2));
  if (problem) return problem;
  RegistryEntry *entry = NULL;
  for (u32 i = 0; i < s->registry_len && entry == NULL; i++)
    if (key_eq(&s->registry[i].id, client)) entry = &s->registry[i];
  if (entry == NULL) {
    if (s->registry_len >= MAX_CLIENTS) return E_RegistryFull;
    entry = &s->registry[s->registry_len++];
    entry->id = *client;
  }
  entry->active = s->next_active;
  entry->replay_class = replay_class;  /* a re-join may come from another machine */
  return SUCCESS;
}

/* Close one account this program owns: zero its data and move its lamports to `spill`
 * (the runtime removes an account left with none at the end of the transaction). */
static void close_account(AccountInfo *a, AccountInfo *spill) {
  sol_memset_(a->data, 0, a->data_len);
  *spill->lamports += *a->lamports;
  *a->lamports = 0;
}

static u64 free_coordinator(State *s, AccountInfo *run, u64 len) {
  AccountInfo *instance = account(2), *spill = account(3);
  if (len != 0) return E_InvalidInstruction;
  if (!instance || !spill) return E_MissingAccount;
  if (!halted(s)) return E_NotHalted;
  if (!instance->is_writable || !spill->is_writable) return E_AccountNotWritable;
  if (!key_eq(instance->owner, CTX->program_id) ||
      instance->data_len != sizeof(CoordinatorInstance))
    return E_WrongAccount;
  const CoordinatorInstance *claim = (const CoordinatorInstance *)instance->data;
  if (!bytes_eq(claim->magic, INSTANCE_MAGIC, 8) || !key_eq(&claim->coordinator_account, run->key))
    return E_WrongAccount;
  if (key_eq(spill->key, run->key) || key_eq(spill->key, instance->key)) return E_WrongAccount;
  /* the metadata PDA is always named, so that no run is closed leaving it behind */
  AccountInfo *metadata = account(4);
  Pubkey address;
  u8 bump;
  if (!metadata) return E_MissingAccount;
  if (metadata_address(run->key, &address, &bump) || !key_eq(&address, metadata->key) ||
      key_eq(spill->key, metadata->key))
    return E_WrongAccount;
  bool metadata_set = key_eq(metadata->owner, CTX->program_id);
  if (metadata_set && !metadata->is_writable) return E_AccountNotWritable;
  if (metadata_set) close_account(metadata, spill);
  close_account(instance, spill);
  close_account(run, spill);
  return SUCCESS;
}

static u64 process(void) {
  if (CTX->data_len < 1) return E_InvalidInstruction;
  u8 tag = CTX->data[0];
  const u8 *data = CTX->data + 1;
  u64 len = CTX->data_len - 1;
  if (tag == 0) return init_coordinator(data, len);
  if (tag == 10) return set_p2p_address(data, len);
  if (tag == 13) return set_run_metadata(data, len);
  State *s;
  u64 problem = load_state(account(0), &s);
  if (problem) return problem;
  Clock clock = now_clock();
  u64 now = clock.unix_timestamp < 0 ? 0 : (u64)clock.unix_timestamp;
  const Pubkey *who = NULL;
  if (tag != 5 && (problem = signer(1, &who))) return problem;
  if (((tag >= 1 && tag <= 3) || tag == 12 || tag == 14) && !key_eq(who, &s->main_authority))
    return E_NotMainAuthority;
  if (tag == 12) return free_coordinator(s, account(0), len);
  s->nonce += 1;
  switch (tag) {
  case 1: return update_run(s, data, len);
  case 2: return set_paused(s, data, len, now);
  case 3: return set_rates(s, data, len);
  case 4: return join_run(s, who, data, len);
  case 5: return len == 0 ? tick(s, now, seed_of(&clock)) : E_InvalidInstruction;
  case 6:
    if (len != WITNESS_WIRE_SIZE) return E_InvalidInstruction;
    return warmup_witness(s, who, data, now, seed_of(&clock));
  case 7:
    if (len != WITNESS_WIRE_SIZE) return E_InvalidInstruction;
    return witness(s, who, data, now);
  case 8: return len == 49 ? health_check(s, who, data) : E_InvalidInstruction;
  case 9: return len == CHECKPOINT_WIRE_SIZE ? checkpoint(s, who, data) : E_InvalidInstruction;
  case 11:
    if (len != VERIFICATION_REPORT_WIRE_SIZE) return E_InvalidInstruction;
    return verification_report(s, who, data);
  case 14: return len == 0 ? accept_model_loss(s) : E_InvalidInstruction;
  default: return E_InvalidInstruction;
  }
}

u64 entrypoint(u8 *input) {
  if (!deserialize(input)) return E_MissingAccount;
  return process();
}
