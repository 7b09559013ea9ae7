#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <torch/version.h>
#include <vector>

#include "core/atomic_io.h"
#include "core/error.h"

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
  static const std::vector<DtypeEntry> t{
      {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
      {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
      {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1}, {"C64", at::kComplexFloat, 8},
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

}  // namespace

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& e : dtype_table())
    if (e.type == t) return e.name;
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

std::string safetensors_bytes(const TensorMap& tensors, const MetadataMap& metadata) {
  json header = json::object();
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, t0] : tensors) {
    if (name == "__metadata__") throw std::invalid_argument("safetensors: reserved tensor name __metadata__");
    at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(t);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // align the data section to 8 bytes
  std::string out;
  out.reserve(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  for (const auto& t : data) out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const MetadataMap& metadata) {
  write_file_atomic(path, safetensors_bytes(tensors, metadata));
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin) {
  const std::string what = "safetensors " + origin;
  const std::string hint = "the file is truncated or not a safetensors file";
  if (size < 8) throw UserError(what, "file has " + std::to_string(size) + " bytes, too short for a header", hint);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(data[i]) << (8 * i);
  if (hlen > kMaxHeaderBytes || hlen > size - 8)
    throw UserError(what, "header length " + std::to_string(hlen) + " exceeds the file size " + std::to_string(size),
                    hint);
  json header;
  try {
    header = json::parse(data + 8, data + 8 + hlen);
  } catch (const json::exception& e) {
    throw UserError(what, std::string("header is not valid JSON: ") + e.what(), hint);
  }
  if (!header.is_object()) throw UserError(what, "header is not a JSON object", hint);
  const uint8_t* base = data + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;

  SafetensorsFile out;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
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
    const std::string tw = what + ": tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw UserError(tw, "entry needs dtype, shape and data_offsets", hint);
    if (!v["dtype"].is_string()) throw UserError(tw, "dtype is not a string", hint);
    const std::string dt = v["dtype"].get<std::string>();
    const DtypeEntry* entry = nullptr;
    for (const auto& e : dtype_table())
      if (dt == e.name) entry = &e;
    if (!entry) {
      if (const char* needs = newer_libtorch_for(dt))
        throw UserError(tw, "unsupported dtype " + dt + " in LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                                std::to_string(TORCH_VERSION_MINOR),
                        std::string("needs LibTorch ") + needs + " or newer (MOH_LIBTORCH=pip scripts/setup.sh)");
      throw UserError(tw, "unsupported dtype " + dt, "supported: " + supported_dtype_list());
    }
    const json& shape = v["shape"];
    if (!shape.is_array()) throw UserError(tw, "shape is not a list", hint);
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        throw UserError(tw, "shape has a non-integer or negative dimension", hint);
      uint64_t x = d.get<uint64_t>();
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw UserError(tw, "shape has a dimension above INT64_MAX (" + std::to_string(x) + ")", hint);
      if (x != 0 && numel > std::numeric_limits<uint64_t>::max() / x / 8)
        throw UserError(tw, "shape is too large", hint);
      numel *= x;
      dims.push_back(static_cast<int64_t>(x));
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw UserError(tw, "data_offsets must be two non-negative integers", hint);
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      throw UserError(tw, "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                              "] fall outside the data section of " + std::to_string(data_size) + " bytes", hint);
    if (e - b != numel * entry->bytes)
      throw UserError(tw, "data_offsets span " + std::to_string(e - b) + " bytes but the shape needs " +
                              std::to_string(numel * entry->bytes), hint);
    spans.push_back({b, e, name});
    at::Tensor t = at::empty(dims, at::TensorOptions().dtype(entry->type));
    if (e > b) std::memcpy(t.data_ptr(), base + b, e - b);
    out.tensors[name] = t;
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end && spans[i].end > spans[i].begin)
      throw UserError(what, "tensors '" + spans[i - 1].name + "' and '" + spans[i].name + "' overlap", hint);
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::string bytes = read_file(path, "safetensors");
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

}  // namespace moh
