#pragma once
// SHA-256 (FIPS 180-4), used to identify weight files in reports (the "6726825d…" of pytorch-fid's Inception file).
// Two compression paths: the plain one (any CPU, the reference) and one through the x86 SHA extensions, taken when
// the CPU has them; the parity test compares them on random blocks.
#include <cstddef>
#include <cstdint>
#include <string>

namespace moh {

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  /// Lower-case hex digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void blocks(const uint8_t* p, size_t n);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

namespace sha256_detail {
/// Compresses n 64-byte blocks into the state h[8]: the plain FIPS 180-4 rounds.
void blocks_plain(uint32_t* h, const uint8_t* p, size_t n);
/// The same through the SHA extensions (SHA-NI); false, and nothing done, on a CPU without them.
bool blocks_sha_ni(uint32_t* h, const uint8_t* p, size_t n);
/// Which path Sha256 takes on this CPU: "SHA extensions" or "plain".
const char* path();
}  // namespace sha256_detail

/// Hex SHA-256 of a byte string.
std::string sha256_hex(const std::string& bytes);
/// Hex SHA-256 of a file's contents (streamed); UserError if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace moh
