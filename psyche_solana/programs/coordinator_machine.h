/* The coordinator state machine: tick and the events, as coordinator/machine.py and
 * coordinator/core.py (docs/coordinator.md: "Tick", "Events", "Health checks",
 * "Rewards"; coordinator/verification.py). Every check runs before the first
 * write, and a failing instruction is rolled back by the runtime anyway. Errors 1-15
 * carry the names of coordinator.CoordinatorError, in that enum's order. */
#ifndef PSYCHE_COORDINATOR_MACHINE_H
#define PSYCHE_COORDINATOR_MACHINE_H
#include "election.h"

enum CoordinatorError {
  E_Halted = 1, E_WrongRunState, E_InvalidClientIndex, E_NotYourIndex, E_NotAClient,
  E_InvalidWitnessProof, E_DuplicateWitness, E_WitnessesFull, E_HealthCheckTooEarly,
  E_InvalidHealthCheck, E_InvalidWithdraw, E_CannotResume, E_InvalidCheckpoint,
  E_CheckpointNotRunRepository, E_InvalidVerificationReport,
  /* append new errors here, as in CoordinatorError */
};

typedef CoordinatorAccount State;

static bool halted(const State *s) {
  return s->run_state == Uninitialized || s->run_state == Finished || s->run_state == Paused;
}
static bool active(const State *s) {
  return s->run_state == RoundTrain || s->run_state == RoundWitness || s->run_state == Cooldown;
}
static Round *current_round(State *s) { return &s->rounds[s->rounds_head]; }
static Round *previous_round(State *s) {
  if (current_round(s)->height == 0) return NULL;
  return &s->rounds[(s->rounds_head + NUM_STORED_ROUNDS - 1) % NUM_STORED_ROUNDS];
}
static bool timed_out(const State *s, u64 now, u64 duration) {
  u64 start = s->run_state_start_unix_timestamp;
  return now != start && now >= sat_add(start, duration);
}
static void change_state(State *s, u64 now, u8 new_state) {
  s->run_state_start_unix_timestamp = now;
  s->run_state = new_state;
}
static u64 witness_target(const State *s) { return witness_count(&s->config, s->clients_len); }
static u64 round_batch_size(const State *s, const Round *r) {
  return batch_size(&s->config, r->data_index * (u64)s->model.max_seq_len);
}

static void move_clients_to_exited(State *s, u32 height) {
  u16 kept = 0;
  for (u16 i = 0; i < s->clients_len; i++) {
    Client *c = &s->clients[i];
    if (c->state == Healthy) {
      if (kept != i) s->clients[kept] = *c;
      kept++;
    } else if (s->exited_len < MAX_CLIENTS) {
      c->exited_height = height;
      s->exited[s->exited_len++] = *c;
    }
  }
  s->clients_len = kept;
}

static void withdraw_all(State *s) {
  for (u16 i = 0; i < s->clients_len; i++)
    if (s->clients[i].state == Healthy) s->clients[i].state = Withdrawn;
}

/* an unwitnessed first round: the holders of the epoch's start model stay */
static void withdraw_all_but_holders(State *s) {
  for (u16 i = 0; i < s->clients_len; i++)
    if (s->clients[i].state == Healthy && !s->clients[i].holds_model)
      s->clients[i].state = Withdrawn;
}

/* a holder of the last epoch's model, between epochs: listed, Healthy or Withdrawn since
 * (core.py holders_listed) */
static bool was_listed(const State *s, const Pubkey *id) {
  for (u16 c = 0; c < s->clients_len; c++)
    if (key_eq(&s->clients[c].id, id))
      return s->clients[c].state == Healthy || s->clients[c].state == Withdrawn;
  return false;
}

static void start_waiting_for_members(State *s, u64 now) {
  change_state(s, now, s->step >= s->config.total_steps ? Finished : WaitingForMembers);
}

static RewardEntry *reward_entry(State *s, const Pubkey *id) {
  for (u32 i = 0; i < s->rewards_len; i++)
    if (key_eq(&s->rewards[i].id, id)) return &s->rewards[i];
  if (s->rewards_len >= MAX_CLIENTS) return NULL;
  RewardEntry *e = &s->rewards[s->rewards_len++];
  e->id = *id; e->earned = 0; e->slashed = 0;
  return e;
}

/* Each Healthy client gets earning_rate_total_shared // len(clients) (docs/coordinator.md,
 * "Rewards"). */
static void credit_epoch(State *s) {
  if (s->clients_len) {
    u64 share = s->current_earning_rate_total_shared / s->clients_len;
    for (u16 i = 0; i < s->clients_len; i++) {
      if (s->clients[i].state != Healthy) continue;
      RewardEntry *e = reward_entry(s, &s->clients[i].id);
      if (e) e->earned = sat_add(e->earned, share);
    }
  }
  for (u16 i = 0; i < s->exited_len; i++) {
    if (s->exited[i].state != Ejected) continue;
    RewardEntry *e = reward_entry(s, &s->exited[i].id);
    if (e) e->slashed = sat_add(e->slashed, s->current_slashing_rate_per_client);
  }
}

static bool is_pending(const State *s, u32 i) { return s->registry[i].active == s->next_active; }

#define FOLLOWERS_PER_TRAINER 2

/* The pending joiners a warm-up may count and list (coordinator/verification.py
 * eligible_joiners, issue 36): with verification on, those of class 0 or of a class that
 * need = min(FOLLOWERS_PER_TRAINER + 1, pending) pending joiners share, so that every
 * listed trainer of a nonzero class has its followers in its class; the others stay
 * pending. One pass: the pending entries' (class << 16 | index) sorted by class (two
 * counting passes of 8 bits: linear compute whatever classes the joiners chose), then
 * each run of one class counted. */
typedef struct { u8 bits[MAX_CLIENTS / 8]; u64 count; } Eligible;

static bool is_eligible(const Eligible *e, u32 i) { return (e->bits[i / 8] >> (i % 8)) & 1; }

/* LSD radix sort of keys by bits 16..31, stable; scratch and counts hold n and 256 u32 */
static void sort_by_class(u32 *keys, u32 *scratch, u32 *counts, u32 n) {
  for (u32 shift = 16; shift < 32; shift += 8) {
    sol_memset_(counts, 0, 256 * sizeof(u32));
    for (u32 k = 0; k < n; k++) counts[(keys[k] >> shift) & 0xff]++;
    for (u32 b = 0, total = 0; b < 256; b++) {
      u32 here = counts[b];
      counts[b] = total;
      total += here;
    }
    for (u32 k = 0; k < n; k++) scratch[counts[(keys[k] >> shift) & 0xff]++] = keys[k];
    sol_memcpy_(keys, scratch, n * sizeof(u32));
  }
}

static void eligible_joiners(const State *s, Eligible *out) {
  /* 3 KiB of the 32 KiB heap: too big for the 512-byte BPF stack */
  u32 *keys = heap_alloc(3 * MAX_CLIENTS * sizeof(u32));
  u32 n = 0;
  sol_memset_(out, 0, sizeof(*out));
  if (keys == NULL) return;  /* never: the coordinator allocates nothing else */
  for (u32 i = 0; i < s->registry_len && i < MAX_CLIENTS; i++)
    if (is_pending(s, i)) keys[n++] = (u32)s->registry[i].replay_class << 16 | i;
  u32 need = n < FOLLOWERS_PER_TRAINER + 1 ? n : FOLLOWERS_PER_TRAINER + 1;
  if (s->config.verification_percent == 0) need = 0;  /* verification off: everyone */
  sort_by_class(keys, keys + MAX_CLIENTS, keys + 2 * MAX_CLIENTS, n);
  for (u32 start = 0; start < n;) {
    u32 end = start, c = keys[start] >> 16;
    while (end < n && keys[end] >> 16 == c) end++;
    if (c == 0 || end - start >= need) {
      for (u32 k = start; k < end; k++) {
        u32 i = keys[k] & 0xffff;
        out->bits[i / 8] |= (u8)(1u << (i % 8));
      }
      out->count += end - start;
    }
    start = end;
  }
}

/* the stored checkpoint is older than the clients' model (core.py
 * falling_back_loses_training) */
static bool falling_back_loses_training(const State *s) {
  u8 tag = s->model.checkpoint_tag;
  return (tag == CkP2P || tag == CkP2PGcs) && s->model_ahead;
}

/* nobody holds the last epoch's model: use the stored one (fall_back_to_stored_checkpoint) */
static void fall_back_to_stored_checkpoint(State *s) {
  if (falling_back_loses_training(s) && s->model_resets < 0xffff) s->model_resets += 1;
  if (s->model.checkpoint_tag == CkP2P) s->model.checkpoint_tag = CkHub;
  else if (s->model.checkpoint_tag == CkP2PGcs) s->model.checkpoint_tag = CkGcs;
  s->model_ahead = 0;
  s->model_lost = 0;
}

/* whether an eligible pending client holds the last epoch's model */
static bool holder_pending(const State *s, const Eligible *eligible) {
  for (u32 i = 0; i < s->registry_len; i++)
    if (is_eligible(eligible, i) && was_listed(s, &s->registry[i].id)) return true;
  return false;
}

/* pending = registry entries whose `active` equals next_active, in registry order; the
 * eligible ones are listed, the others stay pending for the next warm-up. */
static void start_warmup(State *s, u64 now, const Eligible *eligible) {
  /* bit n: the n-th new client (pending, in registry order) was a client of the last epoch */
  u8 previous[MAX_CLIENTS / 8];
  sol_memset_(previous, 0, sizeof(previous));
  bool previous_member = false;
  u32 n = 0;
  for (u32 i = 0; i < s->registry_len && n < MAX_CLIENTS; i++) {
    if (!is_eligible(eligible, i)) continue;
    if (was_listed(s, &s->registry[i].id)) {
      previous[n / 8] |= (u8)(1u << (n % 8));
      previous_member = true;
    }
    n++;
  }
  move_clients_to_exited(s, current_round(s)->height);
  if (!previous_member) fall_back_to_stored_checkpoint(s);
  s->model_lost = 0;
  /* the epoch continues from the last one's clients: they hold its start model */
  bool continuing = s->model.checkpoint_tag == CkP2P || s->model.checkpoint_tag == CkP2PGcs;
  if (!continuing) s->model_ahead = 0;  /* everyone loads the stored checkpoint */
  sol_memset_(s->rounds, 0, sizeof(s->rounds));
  sol_memset_(s->exited, 0, sizeof(s->exited));
  sol_memset_(s->clients, 0, sizeof(s->clients));
  s->clients_len = 0;
  s->exited_len = 0;
  s->verification_seed = 0;  /* Python starts a fresh EpochState */
  sol_memset_(s->reports, 0, sizeof(VerificationReport) * s->reports_len);
  s->reports_len = 0;
  for (u32 i = 0; i < s->registry_len && s->clients_len < MAX_CLIENTS; i++) {
    if (!is_eligible(eligible, i)) continue;
    u16 k = s->clients_len++;
    s->clients[k].id = s->registry[i].id;
    s->clients[k].holds_model = continuing && (previous[k / 8] >> (k % 8) & 1);
    s->clients[k].replay_class = s->registry[i].replay_class;
  }
  u64 joined = s->next_active;
  s->next_active += 1;  /* joins are per epoch: clients re-join for the next one */
  for (u32 i = 0; i < s->registry_len; i++)  /* ...but the ineligible still wait */
    if (s->registry[i].active == joined && !is_eligible(eligible, i))
      s->registry[i].active = s->next_active;
  s->rounds_head = 0;
  s->start_step = s->step;
  s->last_step = 0;
  s->start_timestamp = now;
  s->first_round = 1;
  s->current_earning_rate_total_shared = s->future_earning_rate_total_shared;
  s->current_slashing_rate_per_client = s->future_slashing_rate_per_client;
  change_state(s, now, Warmup);
}

static void start_round_train(State *s, u64 now, u64 seed) {
  u32 head; u32 height; u64 data_index;
  if (s->first_round) {
    head = 0; height = 0; data_index = s->epoch_start_data_index;
  } else {
    Round *previous = current_round(s);
    head = (s->rounds_head + 1) % NUM_STORED_ROUNDS;
    height = previous->height + 1;
    data_index = previous->data_index + round_batch_size(s, previous);
  }
  Round *r = &s->rounds[head];
  s->rounds_head = head;
  if (height > 0) s->model_ahead = 1;  /* this round applies the witnessed one before it */
  r->clients_len = s->clients_len;
  r->height = height;
  r->data_index = data_index;
  r->tie_breaker_tasks = 0;
  r->random_seed = seed;
  sol_memset_(r->witnesses, 0, sizeof(Witness) * r->witnesses_len);
  r->witnesses_len = 0;
  if (height == 0) s->verification_seed = seed;
  change_state(s, now, RoundTrain);
}

static void start_cooldown(State *s, u64 now) {
  Round *r = current_round(s);
  sol_memset_(r->witnesses, 0, sizeof(Witness) * r->witnesses_len);
  r->witnesses_len = 0;
  change_state(s, now, Cooldown);
}

static void enter_paused(State *s, u64 now) {
  withdraw_all(s);
  change_state(s, now, Paused);
  s->pending_pause = 0;
  s->cold_start_epoch = 1;
}

static void end_cooldown(State *s, u64 now) {
  Round *r = current_round(s);
  s->epoch_start_data_index = r->data_index + round_batch_size(s, r);
  if (s->epoch < 0xffff) s->epoch += 1;
  move_clients_to_exited(s, r->height);
  /* the epoch's clients now hold the model: the next epoch fetches it from them */
  u8 tag = s->model.checkpoint_tag;
  if (tag == CkHub || tag == CkDummy) s->model.checkpoint_tag = CkP2P;
  else if (tag == CkGcs) s->model.checkpoint_tag = CkP2PGcs;
  if (s->pending_pause) {
    enter_paused(s, now);
  } else {
    start_waiting_for_members(s, now);
    s->cold_start_epoch = 0;
  }
}

static u64 tick(State *s, u64 now, u64 seed) {
  if (halted(s)) return E_Halted;
  const Config *config = &s->config;
  switch (s->run_state) {
  case WaitingForMembers: {
    Eligible eligible;
    eligible_joiners(s, &eligible);
    if (eligible.count >= config->init_min_clients &&
        timed_out(s, now, config->waiting_for_members_extra_time)) {
      /* the model is gone: wait for a holder, a report or the authority */
      if (!holder_pending(s, &eligible) && falling_back_loses_training(s)) s->model_lost = 1;
      else start_warmup(s, now, &eligible);
    }
    return SUCCESS;
  }
  case Warmup:
    if (timed_out(s, now, config->warmup_time)) { start_round_train(s, now, seed); return SUCCESS; }
    move_clients_to_exited(s, 0);
    if (s->clients_len < config->min_clients) {
      start_waiting_for_members(s, now);
      credit_epoch(s);
    }
    return SUCCESS;
  case RoundTrain:
    if (timed_out(s, now, config->max_round_train_time)) change_state(s, now, RoundWitness);
    return SUCCESS;
  case RoundWitness: {
    if (!timed_out(s, now, config->round_witness_time)) return SUCCESS;
    s->first_round = 0;
    if (s->step < 0xffffffffU) s->step += 1;
    Round *r = current_round(s);
    u64 witnesses = r->witnesses_len;
    move_clients_to_exited(s, r->height);
    if (witnesses == 0) {  /* past the first round the clients hold the model: they stay */
      if (r->height == 0) withdraw_all_but_holders(s);
      start_cooldown(s, now);
      return SUCCESS;
    }
    if (now >= sat_add(s->start_timestamp, config->epoch_time) && s->last_step == 0) {
      /* two more rounds apply the last trained steps; the pipeline needs 4 rounds */
      if ((u64)s->step + 2 >= 4) s->last_step = s->step + 2;
    }
    if (s->last_step != 0 && s->step == s->last_step) { start_cooldown(s, now); return SUCCESS; }
    if (s->clients_len < config->min_clients || witnesses < witness_quorum(witness_target(s)) ||
        s->step >= config->total_steps || s->pending_pause) {
      start_cooldown(s, now);
      return SUCCESS;
    }
    start_round_train(s, now, seed);
    return SUCCESS;
  }
  default: /* Cooldown */
    if (!timed_out(s, now, config->cooldown_time)) return SUCCESS;
    end_cooldown(s, now);
    credit_epoch(s);
    return SUCCESS;
  }
}

/* Wire form of a witness (instruction data): position u64 | index u64 | witness u8 |
 * participant bloom (16 words, 8 keys) | broadcast bloom | broadcast_merkle[32] = 433 B. */
#define WITNESS_WIRE_SIZE 433

static u64 witness_problem(State *s, const Pubkey *sender, u64 index, Round *r) {
  if (index >= s->clients_len) return E_InvalidClientIndex;
  if (!key_eq(&s->clients[index].id, sender)) return E_NotYourIndex;
  for (u32 i = 0; i < r->witnesses_len; i++) {
    u64 stored = r->witnesses[i].index;
    if (stored < s->clients_len && key_eq(&s->clients[stored].id, sender))
      return E_DuplicateWitness;
  }
  u64 target = witness_target(s);
  if (r->witnesses_len >= (target < MAX_WITNESSES ? target : MAX_WITNESSES))
    return E_WitnessesFull;
  return SUCCESS;
}

static void store_witness(Round *r, const u8 *wire) {
  Witness *w = &r->witnesses[r->witnesses_len++];
  w->position = rd_u64(wire);
  w->index = rd_u64(wire + 8);
  w->witness = wire[16] != 0;
  sol_memcpy_(&w->participant_bloom, wire + 17, sizeof(Bloom));
  sol_memcpy_(&w->broadcast_bloom, wire + 17 + sizeof(Bloom), sizeof(Bloom));
  sol_memcpy_(w->broadcast_merkle, wire + 17 + 2 * sizeof(Bloom), 32);
}

static u64 warmup_witness(State *s, const Pubkey *sender, const u8 *wire, u64 now, u64 seed) {
  if (s->run_state == RoundTrain) return SUCCESS;  /* late warm-up witness: harmless */
  if (s->run_state != Warmup) return E_WrongRunState;
  Round *r = current_round(s);
  u64 problem = witness_problem(s, sender, rd_u64(wire + 8), r);
  if (problem) return problem;
  store_witness(r, wire);
  if (r->witnesses_len == witness_target(s)) start_round_train(s, now, seed);
  return SUCCESS;
}

static u64 witness(State *s, const Pubkey *sender, const u8 *wire, u64 now) {
  if (s->run_state != RoundTrain && s->run_state != RoundWitness) return E_WrongRunState;
  Round *r = current_round(s);
  u64 n = r->clients_len, nodes = s->config.witness_nodes;
  if ((nodes != 0 && n < nodes) || s->config.verification_percent > 100)
    return E_InvalidWitnessProof;
  u64 position = rd_u64(wire), index = rd_u64(wire + 8);
  bool flag = wire[16] != 0;
  if (!flag || index >= n) return E_InvalidWitnessProof;
  u8 key[32];
  election_key(r->random_seed, "witness", 7, key);
  u64 expected = swap_or_not(index, n, key);
  if (expected != position || (position < witness_count(&s->config, n)) != flag)
    return E_InvalidWitnessProof;
  u64 problem = witness_problem(s, sender, index, r);
  if (problem) return problem;
  store_witness(r, wire);
  if (r->witnesses_len == witness_target(s) && s->run_state == RoundTrain)
    change_state(s, now, RoundWitness);
  return SUCCESS;
}


static Client *client_at(State *s, u64 index, u64 round_clients_len) {
  if (index >= round_clients_len) return NULL;
  if (index < s->clients_len) return &s->clients[index];
  u64 offset = round_clients_len - index - 1;
  if (offset < s->exited_len) return &s->exited[s->exited_len - 1 - offset];
  return NULL;
}

static i64 index_of(const State *s, const Pubkey *id) {
  for (u16 i = 0; i < s->clients_len; i++) if (key_eq(&s->clients[i].id, id)) return i;
  return -1;
}

/* Health check wire: target key[32] | committee u8 | position u64 | index u64 = 49 B. */
static u64 health_check(State *s, const Pubkey *sender, const u8 *wire) {
  if (!active(s) || s->run_state == Cooldown) return E_WrongRunState;
  if (index_of(s, sender) < 0) return E_NotAClient;
  Round *previous = previous_round(s);
  if (current_round(s)->height < 2 || previous == NULL) return E_HealthCheckTooEarly;
  u64 n = previous->clients_len;
  if (s->config.verification_percent > 100 || (s->config.witness_nodes != 0 && n < s->config.witness_nodes))
    return E_InvalidHealthCheck;
  const Pubkey *target = (const Pubkey *)wire;
  u8 committee = wire[32];
  u64 position = rd_u64(wire + 33), index = rd_u64(wire + 41);
  if (committee != 2 /* Trainer */ || index >= n) return E_InvalidHealthCheck;
  u8 key[32];
  election_key(previous->random_seed, "committee", 9, key);
  u64 expected = swap_or_not(index, n, key);
  u64 verifiers = n * s->config.verification_percent / 100;
  if (expected != position || expected < verifiers) return E_InvalidHealthCheck;
  Client *listed = client_at(s, index, n);
  if (listed == NULL || !bytes_eq(&listed->id, target, 32)) return E_InvalidHealthCheck;
  /* healthy iff >= quorum of the previous round's witnesses saw SHA-256(signer) */
  u8 item[32];
  sha256_2(target->x, 32, NULL, 0, item);
  u64 confirmations = 0;
  for (u32 i = 0; i < previous->witnesses_len; i++)
    confirmations += bloom_contains(&previous->witnesses[i].participant_bloom, item, 32);
  if (confirmations >= witness_quorum(previous->witnesses_len)) return E_InvalidHealthCheck;
  i64 at = index_of(s, target);
  if (at >= 0 && s->clients[at].state == Healthy) s->clients[at].state = Dropped;
  return SUCCESS;
}

/* Checkpoint wire: index u64 | tag u8 (1 Hub, 3 Gcs) | has_second u8 | first[64] | second[64].
 * The location (first; for Gcs also the prefix) is the authority's: a report must name the
 * run's own repository and may only advance its revision, which must be a commit id
 * (coordinator/checkpoint_reports.py): a ref such as refs/pr/1 points wherever its owner
 * sets it. Strings are compared as their zero-padded 64 bytes, as update_model stored them. */
#define CHECKPOINT_WIRE_SIZE 138
#define COMMIT_ID_LEN 40

/* 40 lowercase hex digits, then zero padding (is_commit_id in checkpoint_reports.py) */
static bool is_commit_id(const u8 *revision) {
  for (int i = 0; i < STRING_MAX; i++) {
    u8 c = revision[i];
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (i < COMMIT_ID_LEN ? !hex : c != 0) return false;
  }
  return true;
}

/* the upload holds the model of the epoch's last step unless a round past the next
 * epoch's first applied training since (machine.py checkpoint) */
static void uploaded_model_reported(State *s) {
  if ((s->run_state == RoundTrain || s->run_state == RoundWitness) &&
      current_round(s)->height > 0)
    return;
  s->model_ahead = 0;
  s->model_lost = 0;
}

static u64 checkpoint(State *s, const Pubkey *sender, const u8 *wire) {
  if (halted(s)) return E_Halted;
  u64 index = rd_u64(wire);
  if (index >= s->clients_len) return E_InvalidClientIndex;
  if (!key_eq(&s->clients[index].id, sender)) return E_NotYourIndex;
  u8 repo = wire[8], current = s->model.checkpoint_tag;
  if (repo != CkHub && repo != CkGcs) return E_InvalidCheckpoint;
  bool has_second = wire[9] != 0;
  const u8 *first = wire + 10, *second = wire + 10 + STRING_MAX;
  bool same_repo = bytes_eq(s->model.first, first, STRING_MAX);
  if (repo == CkHub) {
    if (!(current == CkHub || current == CkP2P) || !same_repo) return E_CheckpointNotRunRepository;
    if (!has_second || !is_commit_id(second)) return E_CheckpointNotRunRepository;
    /* the new revision; Hub stays Hub and P2P stays P2P */
    s->model.has_second = true;
    sol_memcpy_(s->model.second, second, STRING_MAX);
    uploaded_model_reported(s);
    return SUCCESS;
  }
  bool same_prefix = s->model.has_second == has_second &&
                     (!has_second || bytes_eq(s->model.second, second, STRING_MAX));
  if (!(current == CkGcs || current == CkP2PGcs) || !same_repo || !same_prefix)
    return E_CheckpointNotRunRepository;
  uploaded_model_reported(s);
  return SUCCESS;  /* a Gcs location has no revision: nothing else changes */
}

/* Verification reports (coordinator/verification.py, machine.py verification_report).
 * The follow plan without building it: members = clients ++ exited sorted by key (the two
 * lists are disjoint: start_warmup fills clients from the registry, one entry per key,
 * and move_clients_to_exited moves a client, never copies it), m of them;
 * pos(x) = swap_or_not(rank(x), m, K("verify")) with rank(x) = members below x. order is
 * members by pos, a permutation: order[p] = the member at position p. The accused t is
 * watched iff pos(t) < watched = min(m, ceil(m * pct / 100)); F = min(2, m - 1).
 * Followers are grouped by replay class c = t's class (issue 36): G = the members of
 * class c (c != 0), g of them, F_c = min(F, g - 1) (0 for c = 0); pos_c(x) =
 * swap_or_not(rank of x in G, g, K("verify" || c_u16_le)). The reporter y follows t iff
 * (y in G and (pos_c(y) - pos_c(t)) mod g is in 1..F_c) or (pos(y) - pos(t)) mod m is in
 * 1..F - F_c. At most four elections of 90 rounds, no table. */
#define VERIFICATION_REPORT_WIRE_SIZE 112  /* accused[32] step u32 hashes[2][32] 3 x u32 */
#define REPORT_QUORUM 2

static bool key_lt(const Pubkey *a, const Pubkey *b) {
  for (int i = 0; i < 32; i++)
    if (a->x[i] != b->x[i]) return a->x[i] < b->x[i];
  return false;
}

/* the member (listed or exited) with this key, or NULL */
static const Client *member(const State *s, const Pubkey *id) {
  for (u16 i = 0; i < s->clients_len; i++) if (key_eq(&s->clients[i].id, id)) return &s->clients[i];
  for (u16 i = 0; i < s->exited_len; i++) if (key_eq(&s->exited[i].id, id)) return &s->exited[i];
  return NULL;
}

/* members of class `replay_class` (every member for ALL_CLASSES) below `id`, and how many
 * there are in all */
#define ALL_CLASSES 0x10000u
static u64 class_rank(const State *s, const Pubkey *id, u32 replay_class, u64 *count) {
  u64 rank = 0, n = 0;
  for (u32 list = 0; list < 2; list++) {
    const Client *clients = list ? s->exited : s->clients;
    u16 len = list ? s->exited_len : s->clients_len;
    for (u16 i = 0; i < len; i++) {
      if (replay_class != ALL_CLASSES && clients[i].replay_class != replay_class) continue;
      n++;
      rank += key_lt(&clients[i].id, id);
    }
  }
  if (count) *count = n;
  return rank;
}

/* (pos(follower) - pos(trainer)) mod n is in 1..followers */
static bool within(u64 follower, u64 trainer, u64 n, u64 followers) {
  u64 distance = (follower + n - trainer) % n;
  return distance >= 1 && distance <= followers;
}

static bool follows(const State *s, const Pubkey *reporter, const Pubkey *accused) {
  u64 m = (u64)s->clients_len + s->exited_len, pct = s->config.verification_percent;
  if (pct == 0 || m < 2) return false;
  const Client *follower = member(s, reporter), *trainer = member(s, accused);
  if (follower == NULL || trainer == NULL) return false;
  u8 key[32];
  election_key(s->verification_seed, "verify", 6, key);
  u64 watched = (m * pct + 99) / 100;
  if (watched > m) watched = m;
  u64 trainer_pos = swap_or_not(class_rank(s, accused, ALL_CLASSES, NULL), m, key);
  if (trainer_pos >= watched) return false;
  u64 per_trainer = m - 1 < FOLLOWERS_PER_TRAINER ? m - 1 : FOLLOWERS_PER_TRAINER;
  u64 same_class = 0;  /* F_c */
  u16 c = trainer->replay_class;
  if (c != 0) {
    u64 g;
    u64 trainer_rank = class_rank(s, accused, c, &g);
    same_class = g - 1 < per_trainer ? g - 1 : per_trainer;
    if (same_class > 0 && follower->replay_class == c) {
      u8 salt[8] = {'v', 'e', 'r', 'i', 'f', 'y', (u8)c, (u8)(c >> 8)};
      u8 class_key[32];
      election_key(s->verification_seed, (const char *)salt, 8, class_key);
      u64 trainer_pos_c = swap_or_not(trainer_rank, g, class_key);
      u64 follower_pos_c = swap_or_not(class_rank(s, reporter, c, NULL), g, class_key);
      if (within(follower_pos_c, trainer_pos_c, g, same_class)) return true;
    }
  }
  if (per_trainer == same_class) return false;
  u64 follower_pos = swap_or_not(class_rank(s, reporter, ALL_CLASSES, NULL), m, key);
  return within(follower_pos, trainer_pos, m, per_trainer - same_class);
}

/* Wire: accused[32] | step u32 | published_hash[32] | expected_hash[32] | jaccard_ppm u32
 * | hamming_ppm u32 | manhattan_ppm u32 = 112 B; the reporter is the signer. */
static u64 verification_report(State *s, const Pubkey *sender, const u8 *wire) {
  if (!active(s)) return E_WrongRunState;
  i64 at = index_of(s, sender);
  if (at < 0 || s->clients[at].state != Healthy) return E_NotAClient;
  const Pubkey *accused = (const Pubkey *)wire;
  u32 step = rd_u32(wire + 32);
  const u8 *published = wire + 36, *expected = wire + 68;
  if (!follows(s, sender, accused)) return E_InvalidVerificationReport;
  if (step < s->start_step || step >= s->step) return E_InvalidVerificationReport;
  if (bytes_eq(published, expected, 32)) return E_InvalidVerificationReport;
  u64 reporters = 1;  /* this one; (reporter, accused) pairs are unique */
  for (u32 i = 0; i < s->reports_len; i++) {
    if (!key_eq(&s->reports[i].accused, accused)) continue;
    if (key_eq(&s->reports[i].reporter, sender)) return E_InvalidVerificationReport;
    reporters++;
  }
  if (s->reports_len >= MAX_REPORTS) return E_InvalidVerificationReport;
  VerificationReport *r = &s->reports[s->reports_len++];
  r->reporter = *sender;
  sol_memcpy_(&r->accused, accused, 32);
  r->step = step;
  sol_memcpy_(r->published_hash, published, 32);
  sol_memcpy_(r->expected_hash, expected, 32);
  r->jaccard_ppm = rd_u32(wire + 100);
  r->hamming_ppm = rd_u32(wire + 104);
  r->manhattan_ppm = rd_u32(wire + 108);
  i64 target = index_of(s, accused);
  if (target >= 0 && reporters >= REPORT_QUORUM && s->clients[target].state == Healthy)
    s->clients[target].state = Ejected;
  return SUCCESS;
}

static u64 pause(State *s, u64 now) {
  if (halted(s)) return E_Halted;
  if (active(s)) s->pending_pause = 1;
  else enter_paused(s, now);
  return SUCCESS;
}

/* the authority accepts that the clients' newer model is lost (machine.py
 * accept_model_loss) */
static u64 accept_model_loss(State *s) {
  if (s->run_state != WaitingForMembers && s->run_state != Paused) return E_WrongRunState;
  if (!falling_back_loses_training(s)) return E_WrongRunState;
  fall_back_to_stored_checkpoint(s);
  return SUCCESS;
}

static u64 resume(State *s, u64 now) {
  if (s->run_state != Paused && s->run_state != Uninitialized) return E_CannotResume;
  start_waiting_for_members(s, now);
  return SUCCESS;
}

#endif
