#include "core/io/sha256.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/io/atomic_io.h"

namespace moh {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

void block_plain(uint32_t* hs, const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) | (uint32_t(p[4 * i + 2]) << 8) | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = hs[0], b = hs[1], c = hs[2], d = hs[3], e = hs[4], f = hs[5], g = hs[6], h = hs[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  const uint32_t out[8] = {a, b, c, d, e, f, g, h};
  for (int i = 0; i < 8; ++i) hs[i] += out[i];
}

#if defined(__x86_64__) || defined(__i386__)
bool cpu_has_sha_ni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return ssse3 && sse41 && (b & (1u << 29));  // CPUID.(EAX=7,ECX=0):EBX bit 29 = SHA
}

// The SHA extensions keep the state as two registers, ABEF and CDGH (named from the highest lane; the comments list
// lanes from lane 0); SHA256RNDS2 does two rounds and returns the new ABEF, whose old value becomes the new CDGH.
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_sha_ni_impl(uint32_t* h, const uint8_t* p, size_t n) {
  const __m128i be = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);  // byte swap per 32-bit word
  const __m128i badc =
      _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);                 // lanes (b,a,d,c)
  __m128i cdgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);  // lanes (h,g,f,e)
  __m128i abef = _mm_alignr_epi8(badc, cdgh, 8);
  cdgh = _mm_blend_epi16(cdgh, badc, 0xF0);
  for (; n > 0; --n, p += 64) {
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i m[4];  // message words W[4g..4g+3] of the last four groups, lane 0 first
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      __m128i& w = m[g & 3];  // holds group g - 4 until overwritten
      if (g < 4) {
        w = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), be);
      } else {
        const __m128i w7 = _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4);  // W[t-7 .. t-4]
        w = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(w, m[(g + 1) & 3]), w7), m[(g + 3) & 3]);
      }
      const __m128i wk = _mm_add_epi32(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * g)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);                           // rounds 4g, 4g+1
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));  // rounds 4g+2, 4g+3
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  // lanes (a,b,e,f)
  const __m128i hgdc = _mm_shuffle_epi32(cdgh, 0xB1);  // lanes (g,h,c,d)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, hgdc, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(hgdc, feba, 8));
}
#endif

using BlocksFn = void (*)(uint32_t*, const uint8_t*, size_t);

BlocksFn chosen_blocks() {
#if defined(__x86_64__) || defined(__i386__)
  if (cpu_has_sha_ni()) return blocks_sha_ni_impl;
#endif
  return sha256_detail::blocks_plain;
}

BlocksFn blocks_fn() {
  static const BlocksFn fn = chosen_blocks();  // the CPU does not change under a running process
  return fn;
}

}  // namespace

namespace sha256_detail {

void blocks_plain(uint32_t* h, const uint8_t* p, size_t n) {
  for (; n > 0; --n, p += 64) block_plain(h, p);
}

bool blocks_sha_ni(uint32_t* h, const uint8_t* p, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  if (!cpu_has_sha_ni()) return false;
  blocks_sha_ni_impl(h, p, n);
  return true;
#else
  (void)h, (void)p, (void)n;
  return false;
#endif
}

const char* path() {
  return blocks_fn() == blocks_plain ? "plain" : "SHA extensions";
}

}  // namespace sha256_detail

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}, buf_{} {}

void Sha256::blocks(const uint8_t* p, size_t n) {
  blocks_fn()(h_, p, n);
}

void Sha256::update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += size;
  if (buf_len_ > 0) {  // complete the partial block first
    const size_t take = std::min(size, sizeof(buf_) - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    size -= take;
    if (buf_len_ < sizeof(buf_)) return;
    blocks(buf_, 1);
    buf_len_ = 0;
  }
  const size_t whole = size / sizeof(buf_);  // straight from the caller's memory
  blocks(p, whole);
  p += whole * sizeof(buf_);
  size -= whole * sizeof(buf_);
  if (size > 0) std::memcpy(buf_, p, size);
  buf_len_ = size;
}

std::string Sha256::hex_digest() {
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (buf_len_ != 56) update(&zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(len, 8);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (uint32_t v : h_)
    for (int s = 28; s >= 0; s -= 4) out += kHex[(v >> s) & 0xf];
  return out;
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 s;
  s.update(bytes.data(), bytes.size());
  return s.hex_digest();
}

std::string sha256_file(const std::string& path) {
  check_regular_file(path, "file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot be opened for hashing", "check the path and permissions");
  Sha256 s;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    s.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return s.hex_digest();
}

}  // namespace moh
