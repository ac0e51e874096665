/* What an instruction checks of its accounts before it acts, shared by the programs that
 * follow the same shape (the mining pool's lenders, the treasurer's participants):
 * accounts present, the user's signature and amount, and program-derived accounts found
 * at the address their seeds give and created there. */
#ifndef PSYCHE_PRELUDE_H
#define PSYCHE_PRELUDE_H
#include "sol.h"
#include "errors.h"
#include "system.h"

/* The first `n` accounts are there. */
static bool have_accounts(u64 n) { return n <= CTX->num_accounts; }

/* An instruction whose user is account 0 and whose payload is one u64 (an amount): the
 * user signed and the payload is 8 bytes, then `amount` is it. */
static u64 user_amount(const u8 *data, u64 len, u64 *amount) {
  if (!account(0)->is_signer) return E_MissingSignature;
  if (len != 8) return E_InvalidInstruction;
  *amount = rd_u64(data);
  return SUCCESS;
}

/* A program-derived address of this program: `count` seeds (3 at most), one more slot where
 * find_derived puts the bump so that the seeds sign for the address, and the bump. Used
 * in place (the last seed points at `bump`): never copied. */
typedef struct {
  Bytes seeds[4];
  u64 count;
  u8 bump;
} Derived;

/* `target` is at the address `pda`'s seeds derive, with its canonical bump. */
static bool find_derived(Derived *pda, const AccountInfo *target) {
  Pubkey address;
  if (sol_try_find_program_address(pda->seeds, (int)pda->count, CTX->program_id, &address,
                                   &pda->bump) ||
      !key_eq(&address, target->key))
    return false;
  pda->seeds[pda->count].addr = &pda->bump;
  pda->seeds[pda->count].len = 1;
  return true;
}

/* payer creates `target` (found by find_derived) with `size` bytes owned by this program,
 * the derived address signing (create_pda_account: a PDA someone sent lamports to is
 * still taken over). */
static u64 create_derived(AccountInfo *payer, AccountInfo *target, const Derived *pda,
                          u64 size) {
  SignerSeeds signers = {pda->seeds, pda->count + 1};
  return create_pda_account(payer, target, size, CTX->program_id, &signers);
}
#endif
