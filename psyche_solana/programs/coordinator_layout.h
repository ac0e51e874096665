/* The coordinator account: the Python CoordinatorState in fixed arrays (docs/coordinator.md,
 * "State layout").
 * Little-endian, naturally aligned, no implicit padding (every pad is named), so that
 * psyche_solana/accounts.py decodes it with plain struct formats. The offsets are
 * checked at compile time below and mirrored in accounts.py.
 */
#ifndef PSYCHE_COORDINATOR_LAYOUT_H
#define PSYCHE_COORDINATOR_LAYOUT_H
#include "sol.h"

#define MAX_CLIENTS 256
#define MAX_WITNESSES 32
#define NUM_STORED_ROUNDS 4
#define MODEL_REST_MAX 1024
#define STRING_MAX 64
#define MAX_REPORTS 32     /* coordinator/verification.py MAX_REPORTS */
#define ACCOUNT_VERSION 4  /* 2: verification_seed and reports appended; 3: a client's
                              holds_model and model_resets in what was padding; 4: a
                              client's replay_class in its padding, the registry entry
                              grows to 48 bytes to keep the joiner's class */

enum RunState { Uninitialized, WaitingForMembers, Warmup, RoundTrain, RoundWitness, Cooldown,
                Finished, Paused };
enum ClientState { Healthy, Dropped, Withdrawn, Ejected };
enum CheckpointTag { CkDummy, CkHub, CkP2P, CkGcs, CkP2PGcs };

typedef struct { u64 words[16]; u64 keys[8]; } Bloom;                       /* 192 */
typedef struct {
  u64 position; u64 index; u8 witness; u8 pad[7];
  Bloom participant_bloom; Bloom broadcast_bloom; u8 broadcast_merkle[32];
} Witness;                                                                  /* 440 */
typedef struct {
  u64 data_index; u64 random_seed; u32 height; u16 clients_len; u16 tie_breaker_tasks;
  u32 witnesses_len; u32 pad;
  Witness witnesses[MAX_WITNESSES];
} Round;                                                                    /* 14112 */
/* holds_model: coordinator.state.Client.holds_model (the model of the epoch's start step);
 * replay_class (v4, was padding): Client.replay_class, the class it joined with (0 = none) */
typedef struct {
  Pubkey id; u8 state; u8 holds_model; u16 replay_class; u32 exited_height;
} Client;                                                                   /* 40 */
typedef struct { Pubkey id; u64 earned; u64 slashed; } RewardEntry;          /* 48 */
/* replay_class (v4): the class join_run gave, copied into the Client entry at warm-up */
typedef struct { Pubkey id; u64 active; u16 replay_class; u8 pad[6]; } RegistryEntry; /* 48 */
/* coordinator.state.VerificationReport, field for field (coordinator/serialization.py) */
typedef struct {
  Pubkey reporter; Pubkey accused; u32 step; u8 published_hash[32]; u8 expected_hash[32];
  u32 jaccard_ppm, hamming_ppm, manhattan_ppm;
} VerificationReport;                                                       /* 144 */

typedef struct {
  u64 warmup_time, cooldown_time, max_round_train_time, round_witness_time, epoch_time,
      global_batch_size_warmup_tokens;
  u32 total_steps;
  u16 init_min_clients, min_clients, witness_nodes, global_batch_size_start,
      global_batch_size_end;
  u8 verification_percent, waiting_for_members_extra_time;
} Config;                                                                   /* 64 */

typedef struct {
  u32 max_seq_len; u32 cold_start_warmup_steps;
  u8 checkpoint_tag; u8 has_second; u8 pad[2]; u32 rest_len;
  u8 first[STRING_MAX]; u8 second[STRING_MAX];
  u8 rest[MODEL_REST_MAX];   /* UTF-8 JSON of the model fields the program never reads */
} Model;                                                                    /* 1168 */

typedef struct {
  u8 magic[8]; u64 version; u64 nonce;                  /* nonce +1 per mutating ix */
  Pubkey main_authority; Pubkey join_authority;
  u8 run_id[32]; u8 client_version[96];
  u8 run_state; u8 pending_pause; u8 first_round; u8 cold_start_epoch;
  u8 config_set; u8 model_set; u8 model_ahead; u8 model_lost;  /* v3, v4: were padding */
  u64 run_state_start_unix_timestamp;
  Config config;
  Model model;
  u16 epoch; u16 model_resets; u32 step; u64 epoch_start_data_index;     /* progress */
  /* model_resets (v3, was padding): CoordinatorState.model_resets */
  u32 rounds_head; u32 start_step; u32 last_step; u16 clients_len; u16 exited_len;
  u64 start_timestamp;
  Round rounds[NUM_STORED_ROUNDS];
  Client clients[MAX_CLIENTS];
  Client exited[MAX_CLIENTS];
  u64 current_earning_rate_total_shared, current_slashing_rate_per_client,
      future_earning_rate_total_shared, future_slashing_rate_per_client;
  u32 rewards_len; u32 pad2;
  RewardEntry rewards[MAX_CLIENTS];
  u64 next_active; u32 registry_len; u32 pad3;
  RegistryEntry registry[MAX_CLIENTS];
  /* epoch_state's verification (appended in version 2): round 0's seed elects the
   * followers; reports of the epoch, cleared with the epoch state at warm-up */
  u64 verification_seed; u32 reports_len; u32 pad4;
  VerificationReport reports[MAX_REPORTS];
} CoordinatorAccount;

#define OFFSET_OF(t, f) __builtin_offsetof(t, f)
_Static_assert(sizeof(Witness) == 440, "witness");
_Static_assert(sizeof(Round) == 14112, "round");
_Static_assert(sizeof(Config) == 64, "config");
_Static_assert(sizeof(Model) == 1168, "model");
_Static_assert(OFFSET_OF(CoordinatorAccount, config) == 232, "config offset");
_Static_assert(OFFSET_OF(CoordinatorAccount, epoch) == 1464, "progress offset");
_Static_assert(OFFSET_OF(CoordinatorAccount, rounds) == 1504, "rounds offset");
_Static_assert(sizeof(VerificationReport) == 144, "report");
_Static_assert(sizeof(Client) == 40, "client");
_Static_assert(OFFSET_OF(Client, replay_class) == 34, "client replay_class");
_Static_assert(sizeof(RegistryEntry) == 48, "registry entry");
_Static_assert(OFFSET_OF(CoordinatorAccount, registry) == 90776, "registry offset");
_Static_assert(OFFSET_OF(CoordinatorAccount, verification_seed) == 103064, "verification offset");
_Static_assert(OFFSET_OF(CoordinatorAccount, reports) == 103080, "reports offset");
_Static_assert(sizeof(CoordinatorAccount) == 107688, "account size");

static const u8 COORDINATOR_MAGIC[8] = {'P', 'S', 'Y', 'C', 'O', 'O', 'R', 'D'};

/* The run id's claim (Psyche's CoordinatorInstance): the coordinator program's PDA
 * ["coordinator", run_id bytes up to the first NUL], created by init_coordinator. It is
 * small because the coordinator account (100 KiB) cannot be created by a program: a
 * CPI may grow an account by 10 KiB at most. One claim per run id makes the id unique,
 * and it names the one account that holds that run. */
typedef struct {
  u8 magic[8]; u8 bump; u8 pad[7];
  Pubkey coordinator_account;
  u8 run_id[32];
} CoordinatorInstance;
_Static_assert(sizeof(CoordinatorInstance) == 80, "instance size");

static const u8 INSTANCE_MAGIC[8] = {'P', 'S', 'Y', 'C', 'I', 'N', 'S', 'T'};
#define INSTANCE_SEED "coordinator"

#endif
