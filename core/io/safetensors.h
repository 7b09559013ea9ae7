#pragma once
// safetensors reader/writer (format: 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then raw little-endian data;
// offsets are relative to the start of the data section). Files written here open with Python's
// `safetensors.torch.load_file`. Every field of a file being read is validated: a truncated or malformed file is a
// UserError, never a crash or an out-of-bounds read.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moh {

/// Name -> tensor, sorted by name.
using TensorMap = std::map<std::string, at::Tensor>;
/// The `__metadata__` string map.
using MetadataMap = std::map<std::string, std::string>;

/// A loaded safetensors file.
struct SafetensorsFile {
  TensorMap tensors;
  MetadataMap metadata;
};

/// Serialises tensors (any device/layout; copied to contiguous CPU) into safetensors bytes.
std::string safetensors_bytes(const TensorMap& tensors, const MetadataMap& metadata = {});

/// Writes a safetensors file atomically (temporary file, fsync, rename).
void save_safetensors(const std::string& path, const TensorMap& tensors, const MetadataMap& metadata = {});

/// Parses safetensors bytes; `origin` names the source in error messages.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin);

/// Reads a safetensors file (tensors are owned CPU copies, read straight into their storage: peak memory is the
/// file's size, not twice it).
SafetensorsFile load_safetensors(const std::string& path);

/// One tensor of a safetensors header: bytes [begin, end) of the data section.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
/// A validated header: entries in header order, metadata, and where the data section starts in the file.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  MetadataMap metadata;
  uint64_t data_start = 0;
};

/// An open safetensors file read on demand: the header is parsed and validated against the file size when opened;
/// tensors, or rows of one, are then read with pread (thread-safe) without loading the rest. For files larger than
/// memory (latent shards read at random rows) and for loading weights one tensor at a time.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const MetadataMap& metadata() const { return header_.metadata; }
  /// The entry named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  /// The whole tensor (an owned CPU tensor).
  at::Tensor read(const SafetensorsEntry& entry) const;
  /// Rows [row, row + count) along dim 0, copied into `dst` (count × the row's bytes).
  void read_rows(const SafetensorsEntry& entry, int64_t row, int64_t count, void* dst) const;

 private:
  size_t pread_all(void* dst, size_t bytes, uint64_t offset) const;
  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
};

/// The safetensors dtype string ("F32", "BF16", ...) of a scalar type; throws for unsupported types.
std::string safetensors_dtype(at::ScalarType t);

}  // namespace moh
