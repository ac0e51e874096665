/* The authorizer program: join authorizations (docs/solana.md, "Authorizer").
 *   0 authorization_create  [payer s w, grantor s, authorization w, system]
 *                           grantee[32] scope_len u8 scope  (created inactive)
 *   1 grantor_update        [grantor s, authorization w]  active u8
 *   2 grantee_update        [grantee s, authorization w]  clear u8 n u8 delegates[n][32]
 *   3 authorization_close   [grantor s, authorization w, spill w]  (inactive only)
 * The permissionless grantee is the zero key (11111111111111111111111111111111).
 */
#include "authorization_layout.h"
#include "errors.h"
#include "system.h"

static u64 create(const u8 *data, u64 len) {
  AccountInfo *payer = account(0), *grantor = account(1), *target = account(2);
  if (!payer || !grantor || !target || !account(3)) return E_MissingAccount;
  if (!payer->is_signer || !grantor->is_signer) return E_MissingSignature;
  if (len < 33 || data[32] == 0 || data[32] > MAX_SCOPE || len != 33 + (u64)data[32])
    return E_InvalidInstruction;
  u8 scope_len = data[32];
  Bytes seeds[4] = {{(const u8 *)"Authorization", 13}, {grantor->key->x, 32}, {data, 32},
                    {data + 33, scope_len}};
  Pubkey address;
  u8 bump;
  if (sol_try_find_program_address(seeds, 4, CTX->program_id, &address, &bump))
    return E_WrongAccount;
  if (!key_eq(&address, target->key)) return E_WrongAccount;
  if (target->data_len != 0) return E_AlreadyInitialized;
  Bytes signer_seeds[5] = {seeds[0], seeds[1], seeds[2], seeds[3], {&bump, 1}};
  SignerSeeds signers = {signer_seeds, 5};
  u64 problem = create_pda_account(payer, target, sizeof(Authorization), CTX->program_id,
                                   &signers);
  if (problem) return problem;
  Authorization *auth = (Authorization *)target->data;
  sol_memcpy_(auth->magic, AUTHORIZATION_MAGIC, 8);
  auth->bump = bump;
  auth->grantor = *grantor->key;
  sol_memcpy_(&auth->grantee, data, 32);
  auth->scope_len = scope_len;
  sol_memcpy_(auth->scope, data + 33, scope_len);
  auth->grantor_update_unix_timestamp = now_clock().unix_timestamp;
  return SUCCESS;
}

static u64 load(AccountInfo *a, Authorization **out) {
  if (a == NULL) return E_MissingAccount;
  if (!key_eq(a->owner, CTX->program_id)) return E_WrongAccountOwner;
  if (a->data_len != sizeof(Authorization)) return E_WrongAccountSize;
  Authorization *auth = (Authorization *)a->data;
  if (!bytes_eq(auth->magic, AUTHORIZATION_MAGIC, 8)) return E_NotInitialized;
  *out = auth;
  return SUCCESS;
}

static u64 process(void) {
  if (CTX->data_len < 1) return E_InvalidInstruction;
  const u8 *data = CTX->data + 1;
  u64 len = CTX->data_len - 1;
  u8 tag = CTX->data[0];
  if (tag == 0) return create(data, len);
  AccountInfo *who = account(0);
  Authorization *auth;
  u64 problem = load(account(1), &auth);
  if (problem) return problem;
  if (who == NULL) return E_MissingAccount;
  if (!who->is_signer) return E_MissingSignature;
  if (tag == 1 || tag == 3) {
    if (!key_eq(who->key, &auth->grantor)) return E_NotGrantor;
    if (tag == 1) {
      if (len != 1) return E_InvalidInstruction;
      auth->active = data[0] != 0;
      auth->grantor_update_unix_timestamp = now_clock().unix_timestamp;
      return SUCCESS;
    }
    AccountInfo *target = account(1), *spill = account(2);
    if (spill == NULL) return E_MissingAccount;
    if (auth->active) return E_AuthorizationActive;
    *spill->lamports += *target->lamports;
    *target->lamports = 0;
    sol_memset_(target->data, 0, target->data_len);
    return SUCCESS;
  }
  if (tag == 2) {
    if (!key_eq(who->key, &auth->grantee)) return E_NotGrantee;
    if (len < 2 || len != 2 + 32 * (u64)data[1]) return E_InvalidInstruction;
    if (data[0]) auth->delegates_len = 0;
    if (auth->delegates_len + data[1] > MAX_DELEGATES) return E_TooManyDelegates;
    sol_memcpy_(&auth->delegates[auth->delegates_len], data + 2, 32 * (u64)data[1]);
    auth->delegates_len += data[1];
    return SUCCESS;
  }
  return E_InvalidInstruction;
}

u64 entrypoint(u8 *input) {
  if (!deserialize(input)) return E_MissingAccount;
  return process();
}
