// The TensorBoard writer's pieces against independent facts: CRC-32C's check value and TFRecord's masking, PNG
// rows read back through zlib, and a written file walked record by record (lengths and both CRCs). The whole file
// against the `tensorboard` package's reader: pyref_tensorboard (tests/core/ref_tensorboard.py).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/io/atomic_io.h"
#include "core/io/tensorboard.h"
#include "tests/test_util.h"

namespace moh {
namespace {

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}
uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

TEST(TensorBoard, Crc32cCheckValueAndMask) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c("abc", 3);
  EXPECT_EQ(masked_crc32c("abc", 3), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  EXPECT_NE(crc32c("abd", 3), c);
}

TEST(TensorBoard, PngRowsInflateBackToThePixels) {
  for (int channels : {1, 3, 4}) {
    const int64_t h = 5, w = 7;
    std::vector<uint8_t> px(static_cast<size_t>(h * w * channels));
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 37 + 11);
    const std::string png = encode_png(px.data(), h, w, channels);
    ASSERT_EQ(png.substr(1, 3), "PNG");
    ASSERT_EQ(png.substr(12, 4), "IHDR");
    EXPECT_EQ(be32(png, 16), w);
    EXPECT_EQ(be32(png, 20), h);
    EXPECT_EQ(static_cast<int>(png[25]), channels == 1 ? 0 : channels == 3 ? 2 : 6);
    const size_t idat = png.find("IDAT");
    ASSERT_NE(idat, std::string::npos);
    const uint32_t n = be32(png, idat - 4);
    std::vector<uint8_t> raw(static_cast<size_t>(h * (w * channels + 1)));
    uLongf size = raw.size();
    ASSERT_EQ(uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(png.data() + idat + 4), n), Z_OK);
    ASSERT_EQ(size, raw.size());
    for (int64_t y = 0; y < h; ++y) {
      EXPECT_EQ(raw[y * (w * channels + 1)], 0);  // filter: none
      EXPECT_EQ(std::memcmp(&raw[y * (w * channels + 1) + 1], &px[y * w * channels], w * channels), 0);
    }
    // each chunk's CRC (zlib's CRC-32 over type + body)
    EXPECT_EQ(be32(png, idat + 4 + n), crc32(0, reinterpret_cast<const Bytef*>(png.data() + idat), n + 4));
  }
}

TEST(TensorBoard, EveryRecordIsFramedWithBothCrcs) {
  test::TempDir d;
  std::string path;
  {
    TensorBoardWriter tb(d.file("tb"), /*resumed_step=*/7);
    tb.add_scalar("loss", 0.5, 8);
    tb.add_text("config", "a: 1", 8);
    tb.add_heatmap("head_load", {{0.25, 0.75}, {1.0}}, 8, 4);
    path = tb.path();
  }
  EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  const std::string f = read_file(path);
  size_t at = 0;
  int records = 0;
  while (at < f.size()) {
    ASSERT_LE(at + 12, f.size());
    const std::string len = f.substr(at, 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(len[i])) << (8 * i);
    EXPECT_EQ(le32(f, at + 8), masked_crc32c(len.data(), 8));
    ASSERT_LE(at + 12 + n + 4, f.size());
    EXPECT_EQ(le32(f, at + 12 + n), masked_crc32c(f.data() + at + 12, n));
    at += 12 + n + 4, ++records;
  }
  EXPECT_EQ(at, f.size());
  EXPECT_EQ(records, 5);  // version, restart mark, scalar, text, image
  EXPECT_NE(f.find("brain.Event:2"), std::string::npos);
  // a second writer in the same directory sorts after the first (TensorBoard reads the files in name order)
  TensorBoardWriter second(d.file("tb"));
  EXPECT_GT(std::filesystem::path(second.path()).filename().string(), std::filesystem::path(path).filename().string());
}

}  // namespace
}  // namespace moh
