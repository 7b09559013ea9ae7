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

/// Reads a safetensors file (tensors are owned CPU copies).
SafetensorsFile load_safetensors(const std::string& path);

/// The safetensors dtype string ("F32", "BF16", ...) of a scalar type; throws for unsupported types.
std::string safetensors_dtype(at::ScalarType t);

}  // namespace moh
