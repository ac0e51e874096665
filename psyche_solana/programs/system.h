/* Creating a program-derived account through the System program (CPI). */
#ifndef PSYCHE_SYSTEM_H
#define PSYCHE_SYSTEM_H
#include "sol.h"
#include "errors.h"

/* rent exemption with the cluster's default rent: (128 + size) * 3480 * 2 lamports */
static u64 rent_exempt(u64 size) { return (128 + size) * 3480 * 2; }

/* One System instruction: tag u32 | args, on `n` accounts, signed by `signers` (or none). */
static u64 system_invoke(AccountMeta *metas, u64 n, u32 tag, const void *args, u64 args_len,
                         const SignerSeeds *signers) {
  u8 data[52];
  sol_memcpy_(data, &tag, 4);
  sol_memcpy_(data + 4, args, args_len);
  Pubkey system_id = {{0}};
  Instruction ix = {&system_id, metas, n, data, 4 + args_len};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, signers, signers ? 1 : 0);
}

/* payer funds `target` (a PDA signed by `signers`) with `size` bytes owned by `owner`.
 * An account this program already owns is AlreadyInitialized. A PDA that someone merely
 * sent lamports to (system-owned, no data) is still taken over, by top-up + allocate +
 * assign as Anchor's `init` does: otherwise a 1-lamport transfer to the address of a
 * run id's claim would block that run id forever. Assumes the System program is among
 * the instruction's accounts (the runtime requires it). BPF calls take at most 5
 * arguments. */
static u64 create_pda_account(AccountInfo *payer, AccountInfo *target, u64 size,
                              const Pubkey *owner, const SignerSeeds *signers) {
  u64 lamports = rent_exempt(size), problem;
  if (*target->lamports == 0) {
    AccountMeta both[2] = {{payer->key, true, true}, {target->key, true, true}};
    u8 args[48];
    sol_memcpy_(args, &lamports, 8);
    sol_memcpy_(args + 8, &size, 8);
    sol_memcpy_(args + 16, owner, 32);
    return system_invoke(both, 2, 0, args, 48, signers);            /* CreateAccount */
  }
  Pubkey system_id = {{0}};
  if (!key_eq(target->owner, &system_id) || target->data_len != 0) return E_AlreadyInitialized;
  if (*target->lamports < lamports) {
    u64 missing = lamports - *target->lamports;
    AccountMeta to[2] = {{payer->key, true, true}, {target->key, true, false}};
    if ((problem = system_invoke(to, 2, 2, &missing, 8, NULL))) return problem;  /* Transfer */
  }
  AccountMeta self[1] = {{target->key, true, true}};
  if ((problem = system_invoke(self, 1, 8, &size, 8, signers))) return problem;    /* Allocate */
  return system_invoke(self, 1, 1, owner, 32, signers);                             /* Assign */
}
#endif
