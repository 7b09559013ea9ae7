#include "datasets/npz.h"

#include <zip.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "core/atomic_io.h"
#include "core/error.h"

namespace moh::datasets {

namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicLen = 6;
constexpr size_t kNpyAlign = 64;  // numpy pads the header so the data starts on a 64-byte boundary
constexpr size_t kMaxHeaderLen = 1 << 20;
constexpr time_t kNpzMemberTime = 1577836800;  // 2020-01-01T00:00:00Z

struct DtypeName {
  const char* descr;
  at::ScalarType type;
};
// Little-endian dtypes LibTorch can hold ('|' = byte order not applicable, '=' = native = little here).
constexpr DtypeName kDtypes[] = {{"u1", at::kByte}, {"i1", at::kChar},  {"b1", at::kBool},   {"i2", at::kShort},
                                 {"i4", at::kInt},  {"i8", at::kLong},  {"f2", at::kHalf},   {"f4", at::kFloat},
                                 {"f8", at::kDouble}};

std::string descr_of(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return (d.descr[1] == '1' ? std::string("|") : std::string("<")) + d.descr;
  throw std::invalid_argument(std::string("npy: unsupported tensor dtype ") + c10::toString(t));
}

// Value of `'key':` in the header dict, up to the next top-level ',' or '}' (tuples kept whole).
std::string dict_value(const std::string& dict, const std::string& key, const std::string& origin) {
  const size_t k = dict.find("'" + key + "'");
  if (k == std::string::npos) throw UserError(origin, "npy header has no '" + key + "'", "not a .npy array");
  size_t p = dict.find(':', k);
  if (p == std::string::npos) throw UserError(origin, "malformed npy header", "not a .npy array");
  ++p;
  while (p < dict.size() && dict[p] == ' ') ++p;
  size_t e = p;
  int depth = 0;
  while (e < dict.size()) {
    const char c = dict[e];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    ++e;
  }
  if (depth != 0) throw UserError(origin, "malformed npy header (unbalanced parentheses)", "not a .npy array");
  return dict.substr(p, e - p);
}

std::string zip_error_text(int code) {
  zip_error_t err;
  zip_error_init_with_code(&err, code);
  std::string s = zip_error_strerror(&err);
  zip_error_fini(&err);
  return s;
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

size_t NpyHeader::row_bytes() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return static_cast<size_t>(n) * c10::elementSize(dtype);
}

NpyHeader parse_npy_header(const std::string& bytes, const std::string& origin) {
  if (bytes.size() < 10 || bytes.compare(0, kNpyMagicLen, kNpyMagic, kNpyMagicLen) != 0)
    throw UserError(origin, "not a .npy array (bad magic)", "expected numpy's \\x93NUMPY header");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t len = 0, start = 0;
  if (major == 1) {
    len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw UserError(origin, "truncated npy header", "");
    for (int i = 0; i < 4; ++i) len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    throw UserError(origin, "unsupported npy version " + std::to_string(major), "versions 1, 2 and 3 are read");
  }
  if (len > kMaxHeaderLen || start + len > bytes.size()) throw UserError(origin, "truncated npy header", "");
  const std::string dict = bytes.substr(start, len);
  NpyHeader h;
  h.data_offset = start + len;

  std::string descr = dict_value(dict, "descr", origin);
  if (descr.size() < 4 || (descr.front() != '\'' && descr.front() != '"'))
    throw UserError(origin, "unsupported npy dtype " + descr, "structured dtypes are not supported");
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() != 3 || descr[0] == '>')
    throw UserError(origin, "unsupported npy dtype '" + descr + "'",
                    "little-endian u1/i1/b1/i2/i4/i8/f2/f4/f8 arrays are read");
  bool found = false;
  for (const auto& d : kDtypes)
    if (descr.compare(1, 2, d.descr) == 0) h.dtype = d.type, found = true;
  if (!found)
    throw UserError(origin, "unsupported npy dtype '" + descr + "'", "u1/i1/b1/i2/i4/i8/f2/f4/f8 arrays are read");

  if (dict_value(dict, "fortran_order", origin) != "False")
    throw UserError(origin, "Fortran-ordered array", "save it with np.ascontiguousarray first");

  const std::string shape = dict_value(dict, "shape", origin);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    throw UserError(origin, "malformed npy shape '" + shape + "'", "");
  size_t p = 1;
  while (p < shape.size() - 1) {
    while (p < shape.size() - 1 && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size() - 1) break;
    size_t e = p;
    while (e < shape.size() - 1 && std::isdigit(static_cast<unsigned char>(shape[e]))) ++e;
    if (e == p || e - p > 15) throw UserError(origin, "malformed npy shape '" + shape + "'", "");
    h.shape.push_back(std::stoll(shape.substr(p, e - p)));
    p = e;
  }
  return h;
}

std::string npy_bytes(const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  std::string shape = "(";
  for (int64_t i = 0; i < t.dim(); ++i) shape += std::to_string(t.size(i)) + (t.dim() == 1 ? ",)" : i + 1 < t.dim() ? ", " : ")");
  if (t.dim() == 0) shape = "()";
  std::string dict = "{'descr': '" + descr_of(t.scalar_type()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = kNpyMagicLen + 4 + dict.size() + 1;
  dict.append((kNpyAlign - total % kNpyAlign) % kNpyAlign, ' ');
  dict += '\n';
  std::string out(kNpyMagic, kNpyMagicLen);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

at::Tensor parse_npy(const std::string& bytes, const std::string& origin) {
  const NpyHeader h = parse_npy_header(bytes, origin);
  const size_t need = static_cast<size_t>(h.numel()) * c10::elementSize(h.dtype);
  if (bytes.size() - h.data_offset != need)
    throw UserError(origin, "npy data has " + std::to_string(bytes.size() - h.data_offset) + " bytes, the header says " +
                                std::to_string(need), "truncated or corrupt file");
  at::Tensor t = at::empty(h.shape, at::TensorOptions().dtype(h.dtype));
  if (need) std::memcpy(t.data_ptr(), bytes.data() + h.data_offset, need);
  return t;
}

void save_npz(const std::string& path, const std::map<std::string, at::Tensor>& arrays, NpzCompression compression) {
  namespace fs = std::filesystem;
  const fs::path final_path(path);
  if (final_path.has_parent_path()) fs::create_directories(final_path.parent_path());
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_EXCL, &err);
  if (!z) throw std::runtime_error("npz " + path + ": cannot create: " + zip_error_text(err));
  std::vector<std::string> buffers;  // must outlive zip_close
  buffers.reserve(arrays.size());
  for (const auto& [name, tensor] : arrays) {
    buffers.push_back(npy_bytes(tensor));
    zip_source_t* src = zip_source_buffer(z, buffers.back().data(), buffers.back().size(), 0);
    const zip_int64_t idx = src ? zip_file_add(z, (name + ".npy").c_str(), src, ZIP_FL_ENC_UTF_8) : -1;
    if (idx < 0) {
      if (src) zip_source_free(src);
      zip_discard(z);
      throw std::runtime_error("npz " + path + ": cannot add " + name);
    }
    // A fixed timestamp makes archives of equal arrays byte-identical (reproducible sampling outputs).
    zip_file_set_mtime(z, static_cast<zip_uint64_t>(idx), kNpzMemberTime, 0);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(idx),
                             compression == NpzCompression::stored ? ZIP_CM_STORE : ZIP_CM_DEFLATE, 0);
  }
  if (zip_close(z) != 0) {
    const std::string why = zip_strerror(z);
    zip_discard(z);
    fs::remove(tmp, ec);
    throw std::runtime_error("npz " + path + ": write failed: " + why);
  }
  fsync_path(tmp);
  fs::rename(tmp, final_path);
  if (final_path.has_parent_path()) fsync_path(final_path.parent_path().string());
}

// ---- reading ------------------------------------------------------------------------------------------------------

NpzReader::NpzReader(const std::string& path) : path_(path), zip_(nullptr) {
  if (!std::filesystem::is_regular_file(path)) throw UserError("npz " + path, "no such file", "check the path");
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (!z) throw UserError("npz " + path, "not a readable zip archive: " + zip_error_text(err), "truncated or not an .npz");
  zip_ = z;
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    std::string name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) names_.push_back(name.substr(0, name.size() - 4));
  }
}

NpzReader::~NpzReader() {
  if (zip_) zip_discard(static_cast<zip_t*>(zip_));
}

bool NpzReader::has(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

void* NpzReader::open_member(const std::string& name, std::string& head) const {
  const std::string origin = "npz " + path_ + " member " + name;
  if (!has(name)) throw UserError(origin, "not in the archive", "members: " + join(names_));
  zip_file_t* f = zip_fopen(static_cast<zip_t*>(zip_), (name + ".npy").c_str(), 0);
  if (!f) throw UserError(origin, std::string("cannot open: ") + zip_strerror(static_cast<zip_t*>(zip_)), "corrupt archive");
  // Read the fixed preamble, then the rest of the header.
  head.assign(12, '\0');
  zip_int64_t got = zip_fread(f, head.data(), 10);
  if (got != 10) {
    zip_fclose(f);
    throw UserError(origin, "truncated npy header", "corrupt archive");
  }
  size_t total = 0;
  const int major = static_cast<uint8_t>(head[6]);
  if (major == 1) {
    total = 10 + (static_cast<uint8_t>(head[8]) | (static_cast<size_t>(static_cast<uint8_t>(head[9])) << 8));
    head.resize(10);
  } else {
    if (zip_fread(f, head.data() + 10, 2) != 2) {
      zip_fclose(f);
      throw UserError(origin, "truncated npy header", "corrupt archive");
    }
    size_t len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<size_t>(static_cast<uint8_t>(head[8 + i])) << (8 * i);
    total = 12 + std::min(len, kMaxHeaderLen + 1);
  }
  const size_t have = head.size();
  if (total > have && total <= kMaxHeaderLen + 12) {
    head.resize(total);
    if (zip_fread(f, head.data() + have, total - have) != static_cast<zip_int64_t>(total - have)) {
      zip_fclose(f);
      throw UserError(origin, "truncated npy header", "corrupt archive");
    }
  }
  return f;
}

NpyHeader NpzReader::header(const std::string& name) const {
  std::string head;
  zip_file_t* f = static_cast<zip_file_t*>(open_member(name, head));
  zip_fclose(f);
  return parse_npy_header(head, "npz " + path_ + " member " + name);
}

std::unique_ptr<NpyRowReader> NpzReader::rows(const std::string& name) const {
  std::string head;
  zip_file_t* f = static_cast<zip_file_t*>(open_member(name, head));
  const std::string origin = "npz " + path_ + " member " + name;
  NpyHeader h;
  try {
    h = parse_npy_header(head, origin);
  } catch (...) {
    zip_fclose(f);
    throw;
  }
  zip_stat_t st;
  if (zip_stat(static_cast<zip_t*>(zip_), (name + ".npy").c_str(), 0, &st) == 0 && (st.valid & ZIP_STAT_SIZE)) {
    const uint64_t need = h.data_offset + static_cast<uint64_t>(h.numel()) * c10::elementSize(h.dtype);
    if (st.size != need) {
      zip_fclose(f);
      throw UserError(origin, "member has " + std::to_string(st.size) + " bytes, its header needs " + std::to_string(need),
                      "truncated or corrupt file");
    }
  }
  return std::unique_ptr<NpyRowReader>(new NpyRowReader(f, h, origin));
}

at::Tensor NpzReader::read(const std::string& name) const {
  auto r = rows(name);
  if (r->header().shape.empty()) {
    at::Tensor t = r->next(1);
    return t.reshape({});
  }
  return r->next(r->rows());
}

NpyRowReader::NpyRowReader(void* file, NpyHeader header, std::string origin)
    : file_(file), header_(std::move(header)), origin_(std::move(origin)) {}

NpyRowReader::~NpyRowReader() {
  if (file_) zip_fclose(static_cast<zip_file_t*>(file_));
}

at::Tensor NpyRowReader::next(int64_t count) {
  const int64_t n = std::max<int64_t>(0, std::min(count, rows_left()));
  std::vector<int64_t> shape = header_.shape;
  if (shape.empty()) shape.push_back(1);
  shape[0] = n;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(header_.dtype));
  const size_t bytes = static_cast<size_t>(n) * header_.row_bytes();
  size_t done = 0;
  auto* dst = static_cast<char*>(t.data_ptr());
  while (done < bytes) {
    const zip_int64_t got = zip_fread(static_cast<zip_file_t*>(file_), dst + done, bytes - done);
    if (got <= 0)
      throw UserError(origin_, "data ends after " + std::to_string(done) + " of " + std::to_string(bytes) + " bytes",
                      "truncated or corrupt file");
    done += static_cast<size_t>(got);
  }
  next_row_ += n;
  return t;
}

}  // namespace moh::datasets
