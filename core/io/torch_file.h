#pragma once
// Reader for files written by Python's `torch.save`, without Python and without LibTorch's pickler (which rejects
// ordinary state_dicts in 1.13). Two containers:
//   zip (PyTorch >= 1.6): PREFIX/data.pkl (pickle protocol 2), PREFIX/data/<key> raw storages, PREFIX/byteorder;
//   legacy (< 1.6 or _use_new_zipfile_serialization=False): five pickles back to back — magic number, protocol
//   version 1001, sys-info, the object, the sorted storage keys — then per storage an int64 element count and the
//   raw little-endian elements.
// The pickles are run by core/io/pickle.h (any unknown class, e.g. argparse.Namespace, becomes an opaque record). Every
// length, index and tensor extent is bounds-checked: a malformed or truncated file is a UserError, never a crash.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/io/pickle.h"
#include "core/io/safetensors.h"

namespace moh {

/// A parsed torch.save file.
struct TorchFile {
  PyRef root;
  std::string format;  ///< "zip" or "legacy"
};

/// True when `bytes` start like a torch.save file (zip archive or legacy pickle).
bool looks_like_torch_file(const std::string& bytes);

/// Parses a torch.save file held in memory; `origin` names it in errors.
TorchFile parse_torch_file(const std::string& bytes, const std::string& origin);

/// Reads and parses a torch.save file.
TorchFile load_torch_file(const std::string& path);

/// The state_dict inside a loaded file: the root itself when it maps names to tensors, else the dict under `key`
/// (e.g. "ema", "model", "state_dict"; dots descend: "checkpoint.model"). A common DataParallel prefix "module." is
/// removed. Non-tensor entries of a state_dict are an error, as is a nested file without `key` (the hint lists the
/// keys).
TensorMap torch_state_dict(const TorchFile& file, const std::string& key, const std::string& origin);

/// Loads the named tensors of any supported weights file: .safetensors (key must be empty) or torch.save (zip/legacy).
TensorMap load_weights_file(const std::string& path, const std::string& key);

}  // namespace moh
