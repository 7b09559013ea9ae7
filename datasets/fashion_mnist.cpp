#include "datasets/fashion_mnist.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/io/atomic_io.h"

namespace moh::datasets {

namespace {
constexpr const char* kPackageHint = "install it with: apt-get install dataset-fashion-mnist (or run scripts/setup.sh)";
constexpr int kIdxUnsignedByte = 0x08;
}  // namespace

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

std::string gunzip(const std::string& bytes, const std::string& origin) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) throw std::runtime_error("zlib init failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  char buf[1 << 16];
  int ret = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    ret = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
    if (ret == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      inflateReset(&zs);  // next gzip member
      continue;
    }
    if (ret != Z_OK) break;
    if (zs.avail_in == 0 && zs.avail_out != 0) break;
  }
  inflateEnd(&zs);
  if (ret != Z_STREAM_END)
    throw UserError(origin, "corrupt or truncated gzip data (zlib code " + std::to_string(ret) + ")", kPackageHint);
  return out;
}

at::Tensor read_idx(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw UserError(path, "file not found", kPackageHint);
  std::string raw = read_file(path, "dataset file");
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f && static_cast<unsigned char>(raw[1]) == 0x8b)
    raw = gunzip(raw, path);
  auto u8 = reinterpret_cast<const unsigned char*>(raw.data());
  if (raw.size() < 4 || u8[0] != 0 || u8[1] != 0 || u8[2] != kIdxUnsignedByte || u8[3] == 0 || u8[3] > 4)
    throw UserError(path, "not an IDX file of unsigned bytes", kPackageHint);
  const int rank = u8[3];
  if (raw.size() < 4 + 4 * static_cast<size_t>(rank)) throw UserError(path, "truncated IDX header", kPackageHint);
  std::vector<int64_t> dims;
  size_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const unsigned char* p = u8 + 4 + 4 * i;
    int64_t d = (int64_t(p[0]) << 24) | (int64_t(p[1]) << 16) | (int64_t(p[2]) << 8) | int64_t(p[3]);
    dims.push_back(d);
    numel *= static_cast<size_t>(d);
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (raw.size() != header + numel)
    throw UserError(
        path, "IDX payload has " + std::to_string(raw.size() - header) + " bytes, header says " + std::to_string(numel),
        kPackageHint);
  at::Tensor t = at::empty(dims, at::kByte);
  std::memcpy(t.data_ptr(), u8 + header, numel);
  return t;
}

ImageSet load_fashion_mnist(const std::string& split, const std::string& dir) {
  std::string prefix;
  if (split == "train")
    prefix = "train";
  else if (split == "test" || split == "val")
    prefix = "t10k";
  else
    throw UserError("fashion-mnist split '" + split + "'", "unknown split", "use train or test");
  if (!std::filesystem::is_directory(dir)) throw UserError("fashion-mnist directory " + dir, "not found", kPackageHint);
  ImageSet set;
  set.images = read_idx(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  set.labels = read_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz").to(at::kLong);
  if (set.images.dim() != 3 || set.labels.dim() != 1 || set.images.size(0) != set.labels.size(0))
    throw UserError("fashion-mnist " + dir, "image and label files disagree in shape", kPackageHint);
  if (set.labels.numel() > 0 && (set.labels.min().item<int64_t>() < 0 || set.labels.max().item<int64_t>() > 9))
    throw UserError("fashion-mnist " + dir, "labels outside 0..9", kPackageHint);
  return set;
}

}  // namespace moh::datasets
