/* An authorization account of the authorizer program (docs/solana.md, "Authorizer"), at
 * the PDA ["Authorization", grantor, grantee, scope] of the authorizer.
 * Valid for user U iff active and (grantee = zero key (permissionless) or grantee = U or
 * U in delegates). */
#ifndef PSYCHE_AUTHORIZATION_LAYOUT_H
#define PSYCHE_AUTHORIZATION_LAYOUT_H
#include "sol.h"

#define MAX_DELEGATES 32
#define MAX_SCOPE 32

typedef struct {
  u8 magic[8];
  u8 bump; u8 active; u8 pad[2]; u32 delegates_len;
  Pubkey grantor; Pubkey grantee;
  u32 scope_len; u32 pad2; u8 scope[MAX_SCOPE];
  i64 grantor_update_unix_timestamp;
  Pubkey delegates[MAX_DELEGATES];
} Authorization;
_Static_assert(sizeof(Authorization) == 1152, "authorization size");

static const u8 AUTHORIZATION_MAGIC[8] = {'P', 'S', 'Y', 'A', 'U', 'T', 'H', 'Z'};

static u64 authorization_address(const Authorization *auth, const Pubkey *program,
                                 Pubkey *out) {
  Bytes seeds[5] = {
      {(const u8 *)"Authorization", 13}, {auth->grantor.x, 32}, {auth->grantee.x, 32},
      {auth->scope, auth->scope_len}, {&auth->bump, 1}};
  return sol_create_program_address(seeds, 5, program, out);
}
#endif
