#pragma once
// Reader for files written by Python's `torch.save`, without Python and without LibTorch's pickler (which rejects
// ordinary state_dicts in 1.13). Two containers:
//   zip (PyTorch >= 1.6): PREFIX/data.pkl (pickle protocol 2), PREFIX/data/<key> raw storages, PREFIX/byteorder;
//   legacy (< 1.6 or _use_new_zipfile_serialization=False): five pickles back to back — magic number, protocol
//   version 1001, sys-info, the object, the sorted storage keys — then per storage an int64 element count and the
//   raw little-endian elements.
// The pickle VM implements the subset checkpoints use: containers (dict/OrderedDict with `_metadata`, list, tuple,
// set), strings, bytes, ints (any size), floats, booleans, None, memo, persistent ids, and the torch rebuild functions
// (_rebuild_tensor[_v2], _rebuild_parameter[_with_state], _rebuild_from_type_v2, typed and untyped storages).
// Any other class (argparse.Namespace, numpy scalars, modules) becomes an opaque object record that keeps its type
// name, constructor arguments and state. Every length, index and tensor extent is bounds-checked: a malformed or
// truncated file is a UserError, never a crash.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"

namespace moh {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

/// One unpickled value.
struct PyValue {
  enum class Kind { none, boolean, integer, big_integer, floating, string, bytes, list, tuple, set, dict, tensor, storage,
                    global, object };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                              ///< string / bytes / big_integer (little-endian two's complement) /
                                                 ///< global and object: the qualified class name "module.Name"
  std::vector<PyRef> items;                      ///< list / tuple / set; object: constructor arguments
  std::vector<std::pair<PyRef, PyRef>> entries;  ///< dict, in insertion order
  PyRef state;                                   ///< dict: instance attributes (OrderedDict's `_metadata`); object: BUILD state
  at::Tensor tensor;                             ///< tensor: the value; storage: its bytes (1-D uint8)
  at::ScalarType dtype = at::kByte;              ///< storage: element type

  ~PyValue();  // iterative: deeply nested input cannot overflow the stack
  /// The value stored under string key `key` of a dict, or null.
  PyRef get(const std::string& key) const;
  /// Short description for error messages ("dict with 4 keys", "tensor float32 [2, 3]", ...).
  std::string describe() const;
};

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
/// removed. Non-tensor entries of a state_dict are an error, as is a nested file without `key` (the hint lists the keys).
TensorMap torch_state_dict(const TorchFile& file, const std::string& key, const std::string& origin);

/// Loads the named tensors of any supported weights file: .safetensors (key must be empty) or torch.save (zip/legacy).
TensorMap load_weights_file(const std::string& path, const std::string& key);

}  // namespace moh
