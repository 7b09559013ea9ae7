#pragma once
// NumPy .npy arrays and .npz archives (zip of <name>.npy members, stored or deflated, Zip64 headers as numpy writes
// them). This is the container of ADM sample batches (`arr_0` uint8 NHWC images, optional `arr_1` labels) and of
// reference statistics (`mu`, `sigma`, `mu_s`, `sigma_s`). Large members are read in row blocks, so a 50k×256²
// sample batch never has to fit in memory twice. Malformed input is a UserError naming the file and member.
#include <ATen/ATen.h>

#include <cstdio>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moh::datasets {

/// Parsed .npy header: little-endian dtype, C order.
struct NpyHeader {
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  ///< bytes from the start of the .npy to the data
  int64_t numel() const;
  size_t row_bytes() const;  ///< bytes of one index along axis 0 (the whole array for 0-d)
};

/// Parses the header of a .npy byte buffer (magic, version 1/2/3, dict with descr/fortran_order/shape).
NpyHeader parse_npy_header(const std::string& bytes, const std::string& origin);
/// The .npy header of an array (version 1.0, padded to 64 bytes, like numpy); the C-order data follows it.
std::string npy_header(at::ScalarType dtype, const std::vector<int64_t>& shape);
/// The .npy encoding of a CPU tensor.
std::string npy_bytes(const at::Tensor& tensor);
/// Decodes a whole .npy buffer.
at::Tensor parse_npy(const std::string& bytes, const std::string& origin);

/// How an archive's members are compressed when written.
enum class NpzCompression { stored, deflated };

/// Writes name → tensor as an .npz (np.savez / np.savez_compressed layout) atomically: the archive appears under
/// `path` only when complete.
void save_npz(const std::string& path, const std::map<std::string, at::Tensor>& arrays,
              NpzCompression compression = NpzCompression::stored);

/// Writes an .npz whose members are streamed in blocks of rows: each member is declared with its dtype and shape,
/// then its rows arrive in order (numpy's np.savez layout: stored .npy members, Zip64 sizes, so archives above 4 GB —
/// 50,000 images of 256² — open with np.load). Memory holds one block, never the array. The archive appears under
/// `path` only when close() has written it completely (a temporary file, fsync, rename); destroyed before close(),
/// the writer removes its temporary file.
class NpzWriter {
 public:
  explicit NpzWriter(std::string path);
  ~NpzWriter();
  NpzWriter(const NpzWriter&) = delete;
  NpzWriter& operator=(const NpzWriter&) = delete;
  /// Starts member `name` (.npy appended) of the given dtype and shape.
  void begin(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& shape);
  /// The member's next rows: (n, shape[1:]...) of its dtype.
  void write_rows(const at::Tensor& rows);
  /// Ends the member (every row must have arrived).
  void end();
  /// Writes the central directory and moves the archive into place.
  void close();

 private:
  struct Member {
    std::string name;
    uint64_t offset = 0, size = 0;
    uint32_t crc = 0;
  };
  void put(const void* data, size_t bytes);
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  uint64_t pos_ = 0;
  std::vector<Member> members_;
  bool open_member_ = false;
  at::ScalarType dtype_ = at::kByte;
  std::vector<int64_t> shape_;
  int64_t rows_left_ = 0;
};

/// Reads one member of an .npz sequentially in blocks of rows (axis 0).
class NpyRowReader {
 public:
  ~NpyRowReader();
  const NpyHeader& header() const { return header_; }
  int64_t rows() const { return header_.shape.empty() ? 1 : header_.shape[0]; }
  int64_t rows_left() const { return rows() - next_row_; }
  /// The next up to `count` rows as a tensor of shape (n, shape[1:]...); empty (0 rows) at the end.
  at::Tensor next(int64_t count);

 private:
  friend class NpzReader;
  NpyRowReader(void* file, NpyHeader header, std::string origin);
  void* file_;  // zip_file_t*
  NpyHeader header_;
  std::string origin_;
  int64_t next_row_ = 0;
};

/// An opened .npz archive.
class NpzReader {
 public:
  explicit NpzReader(const std::string& path);
  ~NpzReader();
  NpzReader(const NpzReader&) = delete;
  NpzReader& operator=(const NpzReader&) = delete;

  const std::string& path() const { return path_; }
  /// Member names without the ".npy" suffix, in archive order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const;
  /// Header of a member (UserError if absent).
  NpyHeader header(const std::string& name) const;
  /// The whole member as a tensor.
  at::Tensor read(const std::string& name) const;
  /// A sequential row reader over a member.
  std::unique_ptr<NpyRowReader> rows(const std::string& name) const;

 private:
  std::string path_;
  void* zip_;  // zip_t*
  std::vector<std::string> names_;
  void* open_member(const std::string& name, std::string& head) const;
};

}  // namespace moh::datasets
