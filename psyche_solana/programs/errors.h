/* Custom error codes shared by the three programs (psyche_solana/errors.py names them).
 * 1-15 are the coordinator's state-machine errors (coordinator_machine.h). */
#ifndef PSYCHE_ERRORS_H
#define PSYCHE_ERRORS_H
enum ProgramError {
  E_InvalidInstruction = 100, E_MissingAccount, E_MissingSignature, E_WrongAccountOwner,
  E_WrongAccountSize, E_AlreadyInitialized, E_NotInitialized, E_NotMainAuthority,
  E_NotAuthorized, E_RegistryFull, E_InvalidConfig, E_InvalidModel, E_NotHalted,
  E_ModelNotSet, E_WrongAccount, E_AccountNotWritable, E_TooManyDelegates,
  E_AuthorizationActive, E_NothingToClaim, E_ClaimTooLarge, E_WrongVault, E_InvalidRunId,
  E_NotAdminInstruction, E_NotGrantor, E_NotGrantee, E_InvalidMetadata,
};
#endif
