/* A minimal Solana runtime for SBPFv0 programs built with clang -target bpfel.
 *
 * Input: the aligned serialization of the BPF loader, at r1:
 *   u64 num_accounts
 *   per account: u8 dup (0xff = not a duplicate, else the index it repeats)
 *     not dup: u8 is_signer, u8 is_writable, u8 executable, u8 pad[4],
 *              key[32], owner[32], u64 lamports, u64 data_len, data[data_len],
 *              10240 bytes of realloc room, pad to 8, u64 rent_epoch
 *     dup:     u8 pad[7]
 *   u64 instruction_data_len, instruction data, program_id[32]
 * No mutable globals exist in SBPFv0: the parsed context lives at the start of the
 * heap (0x300000000, 32 KiB), and a bump allocator hands out the rest.
 */
#ifndef PSYCHE_SOL_H
#define PSYCHE_SOL_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
typedef _Bool bool;
#define true 1
#define false 0
#define NULL ((void *)0)
#define SUCCESS 0ULL
#define MAX_ACCOUNTS 16
#define MAX_PERMITTED_DATA_INCREASE 10240
#define HEAP_START 0x300000000ULL
#define HEAP_SIZE (32 * 1024)

typedef struct { u8 x[32]; } Pubkey;

typedef struct {
  Pubkey *key;
  u64 *lamports;
  u64 data_len;
  u8 *data;
  Pubkey *owner;
  u64 rent_epoch;
  bool is_signer;
  bool is_writable;
  bool executable;
} AccountInfo;

typedef struct { Pubkey *pubkey; bool is_writable; bool is_signer; } AccountMeta;
typedef struct {
  Pubkey *program_id;
  AccountMeta *accounts;
  u64 account_len;
  const u8 *data;
  u64 data_len;
} Instruction;
typedef struct { const u8 *addr; u64 len; } Bytes;   /* also a signer seed */
typedef struct { const Bytes *addr; u64 len; } SignerSeeds;

typedef struct {
  u64 slot;
  i64 epoch_start_timestamp;
  u64 epoch;
  u64 leader_schedule_epoch;
  i64 unix_timestamp;
} Clock;

/* Syscalls: resolved by the loader from the murmur3 hash of their names. */
void sol_log_(const char *, u64);
void sol_log_64_(u64, u64, u64, u64, u64);
void sol_log_pubkey(const Pubkey *);
void sol_memcpy_(void *, const void *, u64);
void sol_memset_(void *, int, u64);
void sol_memcmp_(const void *, const void *, u64, int *);
u64 sol_sha256(const Bytes *, int, u8 *);
u64 sol_get_clock_sysvar(void *);
u64 sol_create_program_address(const Bytes *, int, const Pubkey *, Pubkey *);
u64 sol_try_find_program_address(const Bytes *, int, const Pubkey *, Pubkey *, u8 *);
u64 sol_invoke_signed_c(const Instruction *, const AccountInfo *, int, const SignerSeeds *, int);
void sol_set_return_data(const u8 *, u64);

/* clang may emit calls to these for struct copies: define them (no libc here). */
void *memcpy(void *dst, const void *src, u64 n) { sol_memcpy_(dst, src, n); return dst; }
void *memset(void *dst, int c, u64 n) { sol_memset_(dst, c, n); return dst; }

#define LOG(text) sol_log_(text, sizeof(text) - 1)

static bool bytes_eq(const void *a, const void *b, u64 n) {
  int result = 0;
  sol_memcmp_(a, b, n, &result);
  return result == 0;
}
/* Keys in accounts are 8-byte aligned: compare them as 4 words (a syscall costs more;
 * start_warmup compares up to 256 x 256 keys). */
static bool key_eq(const Pubkey *a, const Pubkey *b) {
  if ((((u64)a) | ((u64)b)) & 7) return bytes_eq(a, b, 32);
  const u64 *x = (const u64 *)a, *y = (const u64 *)b;
  return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}
static bool is_zero(const u8 *p, u64 n) {
  for (u64 i = 0; i < n; i++) if (p[i]) return false;
  return true;
}

/* Little-endian reads of packed instruction data (no alignment assumed). */
static u64 rd_u64(const u8 *p) { u64 v; sol_memcpy_(&v, p, 8); return v; }
static u32 rd_u32(const u8 *p) { u32 v; sol_memcpy_(&v, p, 4); return v; }
static u16 rd_u16(const u8 *p) { u16 v; sol_memcpy_(&v, p, 2); return v; }

static u64 sat_add(u64 a, u64 b) { u64 c = a + b; return c < a ? ~0ULL : c; }

typedef struct {
  AccountInfo accounts[MAX_ACCOUNTS];
  u64 num_accounts;
  const u8 *data;
  u64 data_len;
  const Pubkey *program_id;
  u64 heap_used;
} Context;

#define CTX ((Context *)HEAP_START)

static void *heap_alloc(u64 size) {
  u64 offset = (sizeof(Context) + CTX->heap_used + 7) & ~7ULL;
  if (offset + size > HEAP_SIZE) return NULL;
  CTX->heap_used = offset + size - sizeof(Context);
  return (void *)(HEAP_START + offset);
}

/* Parse the loader's input into CTX; false if there are too many accounts. */
static bool deserialize(u8 *input) {
  Context *ctx = CTX;
  ctx->heap_used = 0;
  u64 n = *(u64 *)input;
  input += 8;
  if (n > MAX_ACCOUNTS) return false;
  ctx->num_accounts = n;
  for (u64 i = 0; i < n; i++) {
    u8 dup = *input;
    input += 1;
    if (dup != 0xff) {
      ctx->accounts[i] = ctx->accounts[dup];
      input += 7;
      continue;
    }
    AccountInfo *a = &ctx->accounts[i];
    a->is_signer = *input++;
    a->is_writable = *input++;
    a->executable = *input++;
    input += 4;
    a->key = (Pubkey *)input; input += 32;
    a->owner = (Pubkey *)input; input += 32;
    a->lamports = (u64 *)input; input += 8;
    a->data_len = *(u64 *)input; input += 8;
    a->data = input;
    input += a->data_len + MAX_PERMITTED_DATA_INCREASE;
    input = (u8 *)(((u64)input + 7) & ~7ULL);
    a->rent_epoch = *(u64 *)input; input += 8;
  }
  ctx->data_len = *(u64 *)input; input += 8;
  ctx->data = input; input += ctx->data_len;
  ctx->program_id = (const Pubkey *)input;
  return true;
}

static AccountInfo *account(u64 i) { return i < CTX->num_accounts ? &CTX->accounts[i] : NULL; }

static void sha256_2(const u8 *a, u64 alen, const u8 *b, u64 blen, u8 out[32]) {
  Bytes parts[2] = {{a, alen}, {b, blen}};
  sol_sha256(parts, blen ? 2 : 1, out);
}

static Clock now_clock(void) {
  Clock clock;
  sol_get_clock_sysvar(&clock);
  return clock;
}

#endif
