#include "datasets/npz.h"

#include <zip.h>
#include <zlib.h>

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/io/atomic_io.h"

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
constexpr DtypeName kDtypes[] = {{"u1", at::kByte},  {"i1", at::kChar},  {"b1", at::kBool},
                                 {"i2", at::kShort}, {"i4", at::kInt},   {"i8", at::kLong},
                                 {"f2", at::kHalf},  {"f4", at::kFloat}, {"f8", at::kDouble}};

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
    if (descr.compare(1, 2, d.descr) == 0) {
      h.dtype = d.type;
      found = true;
    }
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

std::string npy_header(at::ScalarType dtype, const std::vector<int64_t>& dims) {
  const auto rank = static_cast<int64_t>(dims.size());
  std::string shape = "(";
  for (int64_t i = 0; i < rank; ++i) shape += std::to_string(dims[i]) + (rank == 1 ? ",)" : i + 1 < rank ? ", " : ")");
  if (rank == 0) shape = "()";
  std::string dict = "{'descr': '" + descr_of(dtype) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = kNpyMagicLen + 4 + dict.size() + 1;
  dict.append((kNpyAlign - total % kNpyAlign) % kNpyAlign, ' ');
  dict += '\n';
  std::string out(kNpyMagic, kNpyMagicLen);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  return out;
}

std::string npy_bytes(const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  std::string out = npy_header(t.scalar_type(), t.sizes().vec());
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

at::Tensor parse_npy(const std::string& bytes, const std::string& origin) {
  const NpyHeader h = parse_npy_header(bytes, origin);
  const size_t need = static_cast<size_t>(h.numel()) * c10::elementSize(h.dtype);
  if (bytes.size() - h.data_offset != need)
    throw UserError(origin,
                    "npy data has " + std::to_string(bytes.size() - h.data_offset) + " bytes, the header says " +
                        std::to_string(need),
                    "truncated or corrupt file");
  at::Tensor t = at::empty(h.shape, at::TensorOptions().dtype(h.dtype));
  if (need) std::memcpy(t.data_ptr(), bytes.data() + h.data_offset, need);
  return t;
}

void save_npz(const std::string& path, const std::map<std::string, at::Tensor>& arrays, NpzCompression compression) {
  if (compression == NpzCompression::stored) {  // np.savez's layout, written by the streaming writer
    NpzWriter w(path);
    for (const auto& [name, tensor] : arrays) {
      w.begin(name, tensor.scalar_type(), tensor.sizes().vec());
      w.write_rows(tensor);
      w.end();
    }
    w.close();
    return;
  }
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

// ---- streamed writing (np.savez layout with Zip64 sizes) --------------------------------------------------------

namespace {
constexpr uint16_t kZipVersion = 45;                         // 4.5: Zip64
constexpr uint16_t kDosDate2020 = (40 << 9) | (1 << 5) | 1;  // 2020-01-01 (kNpzMemberTime), time 00:00

// Little-endian fields of a zip header.
struct ZipBytes {
  std::string b;
  ZipBytes& u16(uint64_t v) { return put(v, 2); }
  ZipBytes& u32(uint64_t v) { return put(v, 4); }
  ZipBytes& u64(uint64_t v) { return put(v, 8); }
  ZipBytes& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
};
}  // namespace

NpzWriter::NpzWriter(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  const fs::path final_path(path_);
  if (final_path.has_parent_path()) fs::create_directories(final_path.parent_path());
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid());
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_) throw std::runtime_error("npz " + path_ + ": cannot create: " + std::strerror(errno));
}

NpzWriter::~NpzWriter() {
  if (!file_) return;
  std::fclose(file_);
  std::remove(tmp_.c_str());
}

void NpzWriter::put(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes)
    throw std::runtime_error("npz " + path_ + ": write failed: " + std::strerror(errno));
  pos_ += bytes;
}

void NpzWriter::begin(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  TORCH_CHECK(file_ && !open_member_, "NpzWriter::begin: closed, or a member is open");
  const std::string header = npy_header(dtype, shape), entry = name + ".npy";
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  Member m{entry, pos_, header.size() + static_cast<uint64_t>(numel) * c10::elementSize(dtype), 0};
  // Local header with the sizes in its Zip64 field (known in advance); the CRC is patched in by end().
  ZipBytes h;
  h.u32(0x04034b50).u16(kZipVersion).u16(0).u16(0).u16(0).u16(kDosDate2020).u32(0).u32(0xffffffff).u32(0xffffffff);
  h.u16(entry.size()).u16(20);
  h.b += entry;
  h.u16(0x0001).u16(16).u64(m.size).u64(m.size);
  put(h.b.data(), h.b.size());
  m.crc =
      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(header.data()), static_cast<uInt>(header.size())));
  put(header.data(), header.size());
  members_.push_back(m);
  open_member_ = true;
  dtype_ = dtype;
  shape_ = shape;
  rows_left_ = shape.empty() ? 1 : shape[0];
}

void NpzWriter::write_rows(const at::Tensor& rows) {
  TORCH_CHECK(open_member_, "NpzWriter::write_rows: no member is open");
  const at::Tensor t = rows.detach().to(at::kCPU).contiguous();
  const int64_t n = shape_.empty() ? 1 : t.size(0);
  TORCH_CHECK(t.scalar_type() == dtype_ && n <= rows_left_, "NpzWriter::write_rows: dtype or row count");
  if (!shape_.empty())
    TORCH_CHECK(std::vector<int64_t>(t.sizes().begin() + 1, t.sizes().end()) ==
                    std::vector<int64_t>(shape_.begin() + 1, shape_.end()),
                "NpzWriter::write_rows: row shape");
  const auto* p = static_cast<const Bytef*>(t.data_ptr());
  for (size_t done = 0; done < t.nbytes();) {  // zlib's crc32 takes at most 4 GB per call
    const size_t chunk = std::min<size_t>(t.nbytes() - done, size_t{1} << 30);
    members_.back().crc = static_cast<uint32_t>(crc32(members_.back().crc, p + done, static_cast<uInt>(chunk)));
    done += chunk;
  }
  put(t.data_ptr(), t.nbytes());
  rows_left_ -= n;
}

void NpzWriter::end() {
  TORCH_CHECK(open_member_ && rows_left_ == 0, "NpzWriter::end: rows missing from member ", members_.back().name);
  const Member& m = members_.back();
  ZipBytes crc;
  crc.u32(m.crc);
  if (std::fseek(file_, static_cast<long>(m.offset + 14), SEEK_SET) != 0 ||
      std::fwrite(crc.b.data(), 1, 4, file_) != 4 || std::fseek(file_, 0, SEEK_END) != 0)
    throw std::runtime_error("npz " + path_ + ": write failed: " + std::strerror(errno));
  open_member_ = false;
}

void NpzWriter::close() {
  TORCH_CHECK(file_ && !open_member_, "NpzWriter::close: a member is still open");
  const uint64_t cd_start = pos_;
  for (const Member& m : members_) {
    ZipBytes c;
    c.u32(0x02014b50).u16(kZipVersion).u16(kZipVersion).u16(0).u16(0).u16(0).u16(kDosDate2020).u32(m.crc);
    c.u32(0xffffffff).u32(0xffffffff).u16(m.name.size()).u16(28).u16(0).u16(0).u16(0).u32(0).u32(0xffffffff);
    c.b += m.name;
    c.u16(0x0001).u16(24).u64(m.size).u64(m.size).u64(m.offset);
    put(c.b.data(), c.b.size());
  }
  const uint64_t cd_size = pos_ - cd_start, eocd64 = pos_;
  ZipBytes e;
  e.u32(0x06064b50).u64(44).u16(kZipVersion).u16(kZipVersion).u32(0).u32(0).u64(members_.size()).u64(members_.size());
  e.u64(cd_size).u64(cd_start);
  e.u32(0x07064b50).u32(0).u64(eocd64).u32(1);
  e.u32(0x06054b50).u16(0).u16(0).u16(0xffff).u16(0xffff).u32(0xffffffff).u32(0xffffffff).u16(0);
  put(e.b.data(), e.b.size());
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(tmp_.c_str());
    throw std::runtime_error("npz " + path_ + ": write failed: " + std::strerror(errno));
  }
  std::filesystem::rename(tmp_, path_);
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) fsync_path(parent.string());
}

// ---- reading ------------------------------------------------------------------------------------------------------

NpzReader::NpzReader(const std::string& path) : path_(path), zip_(nullptr) {
  if (!std::filesystem::is_regular_file(path)) throw UserError("npz " + path, "no such file", "check the path");
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (!z)
    throw UserError("npz " + path, "not a readable zip archive: " + zip_error_text(err), "truncated or not an .npz");
  zip_ = z;
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    std::string name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0)
      names_.push_back(name.substr(0, name.size() - 4));
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
  if (!f)
    throw UserError(origin, std::string("cannot open: ") + zip_strerror(static_cast<zip_t*>(zip_)), "corrupt archive");
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
      throw UserError(origin,
                      "member has " + std::to_string(st.size) + " bytes, its header needs " + std::to_string(need),
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
