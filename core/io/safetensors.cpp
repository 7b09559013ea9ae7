#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/version.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/io/atomic_io.h"

namespace moh {

using json = nlohmann::json;

namespace {

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
  size_t bytes;
};

#define MOH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// Every dtype the safetensors format and this LibTorch share (the format's names; safetensors.torch's table).
const std::vector<DtypeEntry>& dtype_table() {
  static const std::vector<DtypeEntry> t {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2}, {"BF16", at::kBFloat16, 2},
        {"I64", at::kLong, 8}, {"I32", at::kInt, 4}, {"I16", at::kShort, 2}, {"I8", at::kChar, 1}, {"U8", at::kByte, 1},
        {"BOOL", at::kBool, 1}, {"C64", at::kComplexFloat, 8},
#if MOH_TORCH_AT_LEAST(2, 1)
        {"F8_E4M3", at::kFloat8_e4m3fn, 1}, {"F8_E5M2", at::kFloat8_e5m2, 1},
#endif
#if MOH_TORCH_AT_LEAST(2, 2)
        {"F8_E4M3FNUZ", at::kFloat8_e4m3fnuz, 1}, {"F8_E5M2FNUZ", at::kFloat8_e5m2fnuz, 1},
#endif
#if MOH_TORCH_AT_LEAST(2, 3)
        {"U16", at::kUInt16, 2}, {"U32", at::kUInt32, 4}, {"U64", at::kUInt64, 8},
#endif
  };
  return t;
}

// Format dtypes this LibTorch lacks, with the first LibTorch that has them (for the error message).
const char* newer_libtorch_for(const std::string& dtype) {
  static const std::map<std::string, const char*> t{{"F8_E4M3", "2.1"},     {"F8_E5M2", "2.1"}, {"F8_E4M3FNUZ", "2.2"},
                                                    {"F8_E5M2FNUZ", "2.2"}, {"U16", "2.3"},     {"U32", "2.3"},
                                                    {"U64", "2.3"}};
  auto it = t.find(dtype);
  return it == t.end() ? nullptr : it->second;
}

std::string supported_dtype_list() {
  std::string s;
  for (const auto& e : dtype_table()) s += (s.empty() ? "" : " ") + std::string(e.name);
  return s;
}

// Largest header we accept (the format's reference implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// One tensor entry of a header, checked against the data section's size.
SafetensorsEntry parse_entry(const std::string& tw, const std::string& name, const json& v, uint64_t data_size,
                             const std::string& hint) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    throw UserError(tw, "entry needs dtype, shape and data_offsets", hint);
  if (!v["dtype"].is_string()) throw UserError(tw, "dtype is not a string", hint);
  const std::string dt = v["dtype"].get<std::string>();
  const DtypeEntry* entry = nullptr;
  for (const auto& e : dtype_table())
    if (dt == e.name) entry = &e;
  if (!entry) {
    if (const char* needs = newer_libtorch_for(dt))
      throw UserError(tw,
                      "unsupported dtype " + dt + " in LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                          std::to_string(TORCH_VERSION_MINOR),
                      std::string("needs LibTorch ") + needs + " or newer (MOH_LIBTORCH=pip scripts/setup.sh)");
    throw UserError(tw, "unsupported dtype " + dt, "supported: " + supported_dtype_list());
  }
  const json& shape = v["shape"];
  if (!shape.is_array()) throw UserError(tw, "shape is not a list", hint);
  SafetensorsEntry out;
  out.name = name;
  out.dtype = entry->type;
  uint64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      throw UserError(tw, "shape has a non-integer or negative dimension", hint);
    uint64_t x = d.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw UserError(tw, "shape has a dimension above INT64_MAX (" + std::to_string(x) + ")", hint);
    if (x != 0 && numel > std::numeric_limits<uint64_t>::max() / x / 8) throw UserError(tw, "shape is too large", hint);
    numel *= x;
    out.shape.push_back(static_cast<int64_t>(x));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw UserError(tw, "data_offsets must be two non-negative integers", hint);
  out.begin = off[0].get<uint64_t>();
  out.end = off[1].get<uint64_t>();
  if (out.begin > out.end || out.end > data_size)
    throw UserError(tw,
                    "data_offsets [" + std::to_string(out.begin) + ", " + std::to_string(out.end) +
                        "] fall outside the data section of " + std::to_string(data_size) + " bytes",
                    hint);
  if (out.end - out.begin != numel * entry->bytes)
    throw UserError(tw,
                    "data_offsets span " + std::to_string(out.end - out.begin) + " bytes but the shape needs " +
                        std::to_string(numel * entry->bytes),
                    hint);
  return out;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& e : dtype_table())
    if (e.type == t) return e.name;
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

namespace {

// The 8-byte length and the JSON header (padded to 8 bytes) of `tensors` laid out in name order; nothing is copied.
std::string header_bytes(const TensorMap& tensors, const MetadataMap& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw std::invalid_argument("safetensors: reserved tensor name __metadata__");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // align the data section to 8 bytes
  std::string out;
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + text;
}

// Each tensor as contiguous host bytes, one at a time (a GPU tensor is copied over alone).
template <class Sink>
void for_each_tensor_bytes(const TensorMap& tensors, Sink&& sink) {
  for (const auto& [name, t0] : tensors) {
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    sink(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  }
}

}  // namespace

std::string safetensors_bytes(const TensorMap& tensors, const MetadataMap& metadata) {
  std::string out = header_bytes(tensors, metadata);
  for_each_tensor_bytes(tensors, [&](const char* p, size_t n) { out.append(p, n); });
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const MetadataMap& metadata) {
  AtomicFileWriter f(path);  // streamed: peak memory is the largest tensor, not the file
  const std::string head = header_bytes(tensors, metadata);
  f.write(head.data(), head.size());
  for_each_tensor_bytes(tensors, [&](const char* p, size_t n) { f.write(p, n); });
  f.commit();
}

namespace {

// The validated header of a safetensors buffer or file: `size` bytes in all, `head` = the first 8 + N of them.
SafetensorsHeader parse_header(const uint8_t* head, size_t head_size, uint64_t size, const std::string& origin) {
  const std::string what = "safetensors " + origin;
  const std::string hint = "the file is truncated or not a safetensors file";
  if (size < 8 || head_size < 8)
    throw UserError(what, "file has " + std::to_string(size) + " bytes, too short for a header", hint);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(head[i]) << (8 * i);
  if (hlen > kMaxHeaderBytes || hlen > size - 8)
    throw UserError(what, "header length " + std::to_string(hlen) + " exceeds the file size " + std::to_string(size),
                    hint);
  if (head_size < 8 + hlen) throw UserError(what, "header is cut short", hint);
  json header;
  try {
    header = json::parse(head + 8, head + 8 + hlen);
  } catch (const json::exception& e) {
    throw UserError(what, std::string("header is not valid JSON: ") + e.what(), hint);
  }
  if (!header.is_object()) throw UserError(what, "header is not a JSON object", hint);
  SafetensorsHeader out;
  out.data_start = 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw UserError(what, "__metadata__ is not an object", hint);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw UserError(what, "__metadata__." + m.key() + " is not a string", hint);
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(what + ": tensor '" + name + "'", name, v, data_size, hint));
  }
  std::vector<const SafetensorsEntry*> spans;
  for (const auto& e : out.entries) spans.push_back(&e);
  std::sort(spans.begin(), spans.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i]->begin < spans[i - 1]->end && spans[i]->end > spans[i]->begin)
      throw UserError(what, "tensors '" + spans[i - 1]->name + "' and '" + spans[i]->name + "' overlap", hint);
  return out;
}

}  // namespace

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin) {
  const SafetensorsHeader h = parse_header(data, size, size, origin);
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const auto& e : h.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + h.data_start + e.begin, e.end - e.begin);
    out.tensors[e.name] = t;
  }
  return out;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  check_regular_file(path, "safetensors");  // before the open, which would wait for ever on a named pipe
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError("safetensors " + path, std::strerror(errno), "check the path");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw UserError("safetensors " + path, "not a regular file", "check the path");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  try {
    // The length prefix, then (if it is plausible) the header it announces; parse_header judges both.
    std::vector<uint8_t> head(std::min<uint64_t>(size, 8));
    if (!head.empty()) pread_all(head.data(), head.size(), 0);
    uint64_t hlen = 0;
    for (size_t i = 0; i < head.size(); ++i) hlen |= static_cast<uint64_t>(head[i]) << (8 * i);
    if (head.size() == 8 && hlen <= kMaxHeaderBytes && hlen <= size - 8) {
      head.resize(8 + hlen);
      pread_all(head.data() + 8, hlen, 8);
    }
    header_ = parse_header(head.data(), head.size(), size, path);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

size_t SafetensorsReader::pread_all(void* dst, size_t bytes, uint64_t offset) const {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error("safetensors " + path_ + ": read failed: " + std::strerror(errno));
    if (r == 0) throw UserError("safetensors " + path_, "file ended early (truncated while being read?)", "");
    done += static_cast<size_t>(r);
  }
  return done;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const auto& e : header_.entries)
    if (e.name == name) return &e;
  return nullptr;
}

at::Tensor SafetensorsReader::read(const SafetensorsEntry& e) const {
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) pread_all(t.data_ptr(), e.end - e.begin, header_.data_start + e.begin);
  return t;
}

void SafetensorsReader::read_rows(const SafetensorsEntry& e, int64_t row, int64_t count, void* dst) const {
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  TORCH_CHECK(row >= 0 && count >= 0 && row + count <= rows, "safetensors read_rows: rows out of range");
  const uint64_t row_bytes = rows == 0 ? 0 : (e.end - e.begin) / static_cast<uint64_t>(rows);
  if (count > 0)
    pread_all(dst, row_bytes * static_cast<uint64_t>(count), header_.data_start + e.begin + row_bytes * row);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);  // each tensor read straight into its own storage: peak memory = the file
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (const auto& e : reader.entries()) out.tensors[e.name] = reader.read(e);
  return out;
}

}  // namespace moh
