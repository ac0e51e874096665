/* Elections, bloom filters and batch sizes, bit for bit as coordinator/ (docs/coordinator.md:
 * "Committees and witness election", "Data assignment", "Bloom filters").
 *
 *   S = SHA-256(seed_u64_le);  K = SHA-256(S || salt)   salt "committee" | "witness"
 *   swap_or_not(i, n, K), r = 0..89:
 *     pivot = u64_le(SHA-256(K || [r])[0:8]) % n;  flip = (pivot + n - i) % n
 *     p = max(i, flip);  h = SHA-256(K || [r] || u32_le(p / 256))
 *     if bit (p % 256) of h (byte (p % 256) / 8, LSB first) is set: i = flip
 *   bloom position under key k: fnv1a64_k(item) % 1024;  fnv: h = (h ^ b) * 0x100000001b3
 */
#ifndef PSYCHE_ELECTION_H
#define PSYCHE_ELECTION_H
#include "coordinator_layout.h"

static void election_key(u64 seed, const char *salt, u64 salt_len, u8 key[32]) {
  u8 s[32];
  sha256_2((const u8 *)&seed, 8, NULL, 0, s);
  sha256_2(s, 32, (const u8 *)salt, salt_len, key);
}

static u64 swap_or_not(u64 index, u64 n, const u8 key[32]) {
  u8 digest[32];
  for (u32 r = 0; r < 90; r++) {
    u8 round_byte[5] = {(u8)r, 0, 0, 0, 0};
    sha256_2(key, 32, round_byte, 1, digest);
    u64 pivot = rd_u64(digest) % n;
    u64 flip = (pivot + n - index) % n;
    u64 p = index > flip ? index : flip;
    u32 chunk = (u32)(p / 256);
    sol_memcpy_(round_byte + 1, &chunk, 4);
    sha256_2(key, 32, round_byte, 5, digest);
    if ((digest[(p % 256) / 8] >> (p % 8)) & 1) index = flip;
  }
  return index;
}

static u64 witness_count(const Config *config, u64 n) {
  if (config->witness_nodes) return config->witness_nodes;
  return n < MAX_WITNESSES ? n : MAX_WITNESSES;
}

/* 1 -> 1, 2 -> 2, 3 -> 2, n >= 4 -> floor(2n / 3) */
static u64 witness_quorum(u64 witnesses) {
  if (witnesses <= 2) return witnesses;
  if (witnesses == 3) return 2;
  return 2 * witnesses / 3;
}

static bool bloom_contains(const Bloom *bloom, const u8 *item, u64 len) {
  for (int k = 0; k < 8; k++) {
    u64 h = bloom->keys[k];
    for (u64 i = 0; i < len; i++) h = (h ^ item[i]) * 0x100000001b3ULL;
    u64 position = h % 1024;
    if (!((bloom->words[position / 64] >> (position % 64)) & 1)) return false;
  }
  return true;
}

/* Global batch size after `tokens` tokens:
 *   end                                              if tokens >= W
 *   floor(start + (end - start) * tokens / W + 1/2)  otherwise (exact rational arithmetic;
 *   coordinator/ computes it in f64, which agrees whenever the quotient is exact, e.g. W a
 *   power of two).  (end - start) * tokens needs 80 bits: 128-bit long division below. */
static u64 batch_size(const Config *config, u64 tokens) {
  u64 start = config->global_batch_size_start, end = config->global_batch_size_end;
  u64 w = config->global_batch_size_warmup_tokens;
  if (tokens >= w) return end;
  u64 d = end - start;                         /* < 2^16 */
  u64 lo_part = d * (tokens & 0xffffffffULL);  /* < 2^48 */
  u64 hi_part = d * (tokens >> 32);            /* < 2^48, weight 2^32 */
  u64 lo = lo_part + (hi_part << 32);
  u64 hi = (hi_part >> 32) + (lo < lo_part ? 1 : 0);
  u64 q = 0, rem = 0;
  for (int bit = 127; bit >= 0; bit--) {
    u64 top = rem >> 63;
    rem = (rem << 1) | ((bit >= 64 ? hi >> (bit - 64) : lo >> bit) & 1);
    if (top || rem >= w) { rem -= w; if (bit < 64) q |= 1ULL << bit; }
  }
  return start + q + (rem >= w - rem ? 1 : 0);
}

#endif
