/* Run metadata (Psyche's RunMetadata{name[64], description[280], num_parameters,
 * vocab_size}), kept in a PDA ["metadata", coordinator account] beside the run: the run's
 * state account has no room for it, and its layout is mirrored by coordinator/ (Python),
 * so it stays as it is. Included by coordinator.c (instruction 13, and free_coordinator
 * closes the PDA with the run). */
#ifndef PSYCHE_RUN_METADATA_H
#define PSYCHE_RUN_METADATA_H
#include "coordinator_layout.h"
#include "errors.h"
#include "system.h"

#define METADATA_NAME_MAX 64
#define METADATA_DESCRIPTION_MAX 280
#define METADATA_HEAD 20 /* name_len u16 description_len u16 num_parameters u64 vocab_size u64 */

typedef struct {
  u8 magic[8]; u16 name_len; u16 description_len; u8 pad[4];
  u64 num_parameters; u64 vocab_size;
  u8 name[METADATA_NAME_MAX]; u8 description[METADATA_DESCRIPTION_MAX];
} RunMetadata;
_Static_assert(sizeof(RunMetadata) == 376, "metadata size");
static const u8 METADATA_MAGIC[8] = {'P', 'S', 'Y', 'M', 'E', 'T', 'A', 'D'};

static u64 metadata_address(const Pubkey *run, Pubkey *out, u8 *bump) {
  Bytes seeds[2] = {{(const u8 *)"metadata", 8}, {run->x, 32}};
  return sol_try_find_program_address(seeds, 2, CTX->program_id, out, bump);
}

/* Well-formed UTF-8 (no stray continuation bytes, no truncated sequence), so that every
 * reader can show the name and description as text. */
static bool utf8_valid(const u8 *p, u64 n) {
  for (u64 i = 0; i < n;) {
    u8 c = p[i];
    u64 extra = c < 0x80 ? 0 : (c >= 0xC2 && c <= 0xDF) ? 1 : (c >= 0xE0 && c <= 0xEF) ? 2
              : (c >= 0xF0 && c <= 0xF4) ? 3 : 4;
    if (extra == 4 || n - i - 1 < extra) return false;
    for (u64 k = 1; k <= extra; k++)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    i += extra + 1;
  }
  return true;
}

/* 13 set_run_metadata [account, main_authority s, payer s w, metadata PDA w, system]
 * name_len u16 description_len u16 num_parameters u64 vocab_size u64 name description.
 * Any time in the run's life (Psyche's update takes metadata while running too); the
 * payer funds the PDA the first time (a treasurer run's authority, its Run PDA, cannot). */
static u64 set_run_metadata(const u8 *data, u64 len) {
  AccountInfo *run = account(0), *authority = account(1), *payer = account(2),
              *entry = account(3);
  if (!run || !authority || !payer || !entry || !account(4)) return E_MissingAccount;
  if (!key_eq(run->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (run->data_len != sizeof(CoordinatorAccount)) return E_WrongAccountSize;
  const CoordinatorAccount *s = (const CoordinatorAccount *)run->data;
  if (!bytes_eq(s->magic, COORDINATOR_MAGIC, 8)) return E_NotInitialized;
  if (!authority->is_signer || !payer->is_signer) return E_MissingSignature;
  if (!key_eq(authority->key, &s->main_authority)) return E_NotMainAuthority;
  if (len < METADATA_HEAD) return E_InvalidInstruction;
  u16 name_len = rd_u16(data), description_len = rd_u16(data + 2);
  if (len != METADATA_HEAD + (u64)name_len + description_len) return E_InvalidInstruction;
  const u8 *name = data + METADATA_HEAD, *description = name + name_len;
  if (name_len > METADATA_NAME_MAX || description_len > METADATA_DESCRIPTION_MAX ||
      !utf8_valid(name, name_len) || !utf8_valid(description, description_len))
    return E_InvalidMetadata;
  Pubkey address;
  u8 bump;
  if (metadata_address(run->key, &address, &bump) || !key_eq(&address, entry->key))
    return E_WrongAccount;
  if (!key_eq(entry->owner, CTX->program_id)) {
    Bytes signer_seeds[3] = {{(const u8 *)"metadata", 8}, {run->key->x, 32}, {&bump, 1}};
    SignerSeeds signers = {signer_seeds, 3};
    u64 problem = create_pda_account(payer, entry, sizeof(RunMetadata), CTX->program_id,
                                     &signers);
    if (problem) return problem;
  }
  if (entry->data_len != sizeof(RunMetadata)) return E_WrongAccount;
  RunMetadata *m = (RunMetadata *)entry->data;
  sol_memset_(m, 0, sizeof(RunMetadata));
  sol_memcpy_(m->magic, METADATA_MAGIC, 8);
  m->name_len = name_len;
  m->description_len = description_len;
  m->num_parameters = rd_u64(data + 4);
  m->vocab_size = rd_u64(data + 12);
  sol_memcpy_(m->name, name, name_len);
  sol_memcpy_(m->description, description, description_len);
  return SUCCESS;
}
#endif
