/* Creating a program-derived account through the System program (CPI). */
#ifndef PSYCHE_SYSTEM_H
#define PSYCHE_SYSTEM_H
#include "sol.h"
#include "errors.h"

/* rent exemption with the cluster's default rent: (128 + size) * 3480 * 2 lamports */
static u64 rent_exempt(u64 size) { return (128 + size) * 3480 * 2; }

/* payer funds `target` (a PDA signed by `signers`) (BPF calls take at most 5 arguments) with `size` bytes. Assumes the
 * System program is among the instruction's accounts (the runtime requires it). */
static u64 create_pda_account(AccountInfo *payer, AccountInfo *target, u64 size,
                              const Pubkey *owner, const SignerSeeds *signers) {
  if (*target->lamports != 0) return E_AlreadyInitialized;
  u8 data[52];
  u32 create_account = 0;
  u64 lamports = rent_exempt(size);
  sol_memcpy_(data, &create_account, 4);
  sol_memcpy_(data + 4, &lamports, 8);
  sol_memcpy_(data + 12, &size, 8);
  sol_memcpy_(data + 20, owner, 32);
  Pubkey system_id = {{0}};
  AccountMeta metas[2] = {{payer->key, true, true}, {target->key, true, true}};
  Instruction ix = {&system_id, metas, 2, data, 52};
  return sol_invoke_signed_c(&ix, CTX->accounts, (int)CTX->num_accounts, signers, 1);
}
#endif
