#pragma once
// The pickle virtual machine behind the torch.save reader (core/io/torch_file.h): protocols 0–5 as far as checkpoints
// use them — containers (dict/OrderedDict with `_metadata`, list, tuple, set), strings, bytes, ints of any size,
// floats, booleans, None, memo, persistent ids, and the torch rebuild functions (_rebuild_tensor[_v2],
// _rebuild_parameter[_with_state], _rebuild_from_type_v2). Any other class becomes an opaque object record. Every
// length and memo index is bounds-checked; a malformed pickle is a UserError, never a crash.
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moh {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

/// One unpickled value.
struct PyValue {
  enum class Kind {
    none,
    boolean,
    integer,
    big_integer,
    floating,
    string,
    bytes,
    list,
    tuple,
    set,
    dict,
    tensor,
    storage,
    global,
    object
  };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                              ///< string / bytes / big_integer (little-endian two's complement) /
                                                 ///< global and object: the qualified class name "module.Name"
  std::vector<PyRef> items;                      ///< list / tuple / set; object: constructor arguments
  std::vector<std::pair<PyRef, PyRef>> entries;  ///< dict, in insertion order
  PyRef state;                       ///< dict: instance attributes (OrderedDict's `_metadata`); object: BUILD state
  at::Tensor tensor;                 ///< tensor: the value; storage: its bytes (1-D uint8)
  at::ScalarType dtype = at::kByte;  ///< storage: element type

  ~PyValue();  // iterative: deeply nested input cannot overflow the stack
  /// The value stored under string key `key` of a dict, or null.
  PyRef get(const std::string& key) const;
  /// Short description for error messages ("dict with 4 keys", "tensor float32 [2, 3]", ...).
  std::string describe() const;
};

namespace pickle {

using Kind = PyValue::Kind;

/// A new value of kind `k`.
PyRef make(Kind k);

/// A tensor whose storage bytes may arrive later (legacy format): rebuilt once every storage is read.
struct PendingTensor {
  PyRef value, storage;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
};

/// Element type of a torch storage class ("torch.FloatStorage", ...); others are a UserError.
at::ScalarType storage_dtype(const std::string& name, const std::string& origin);

/// Resolves a persistent id (torch: a storage reference) to a value.
using PersistentLoad = std::function<PyRef(const PyRef&)>;

/// Runs one pickle that starts at byte `start` of `data`; returns its value and sets `end` to the byte after its
/// STOP. Tensors rebuilt on the way are appended to `tensors` (materialize them once their storages are loaded).
PyRef unpickle(const uint8_t* data, size_t size, size_t start, const std::string& origin,
               const PersistentLoad& persistent, std::vector<PendingTensor>& tensors, size_t& end);

/// Turns every pending tensor into a strided view of its storage, after checking that it stays inside it.
void materialize(std::vector<PendingTensor>& tensors, const std::string& origin);

/// A storage value holding raw bytes (bool bytes normalised to 0/1).
PyRef make_storage(at::Tensor bytes, at::ScalarType dtype);

/// A 1-D uint8 tensor copy of n bytes.
at::Tensor bytes_tensor(const uint8_t* data, size_t n);

}  // namespace pickle
}  // namespace moh
