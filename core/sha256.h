#pragma once
// SHA-256 (FIPS 180-4), used to identify weight files in reports (the "6726825d…" of pytorch-fid's Inception file).
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
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

/// Hex SHA-256 of a byte string.
std::string sha256_hex(const std::string& bytes);
/// Hex SHA-256 of a file's contents (streamed); UserError if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace moh
