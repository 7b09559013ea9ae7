// Image decoding (datasets/image_decode.h): the libjpeg path equals OpenCV's imread on intact files (the reference),
// damaged JPEGs/PNGs are refused (never grey-filled), oversized images are decoded smaller or refused.
#include "datasets/image_decode.h"
#include "tests/test_util.h"

#include <zlib.h>

#ifdef MOH_WITH_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::datasets {
namespace {

#ifdef MOH_WITH_OPENCV
std::string encode(const cv::Mat& m, const std::string& ext) {
  std::vector<uchar> b;
  cv::imencode(ext, m, b, {cv::IMWRITE_JPEG_QUALITY, 90});
  return std::string(b.begin(), b.end());
}

cv::Mat test_picture(int rows, int cols, int type) {
  cv::Mat m(rows, cols, type);
  cv::randu(m, 0, 255);
  cv::GaussianBlur(m, m, cv::Size(5, 5), 0);  // photo-like: compresses, entropy data of realistic size
  return m;
}

at::Tensor opencv_reference(const std::string& path, bool grey) {
  cv::Mat m = cv::imread(path, grey ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR);
  if (!grey) cv::cvtColor(m, m, cv::COLOR_BGR2RGB);
  return at::from_blob(m.data, {m.rows, m.cols, m.channels()}, at::kByte).clone();
}

TEST(ImageDecode, IntactFilesEqualOpenCV) {
  test::TempDir d;
  d.write("c.jpg", encode(test_picture(37, 53, CV_8UC3), ".jpg"));
  d.write("g.jpg", encode(test_picture(40, 24, CV_8UC1), ".jpg"));
  d.write("c.png", encode(test_picture(19, 23, CV_8UC3), ".png"));
  for (const char* f : {"c.jpg", "g.jpg", "c.png"})
    for (bool grey : {false, true}) {
      const DecodedImage img = read_image(d.file(f), grey ? 1 : 3);
      ASSERT_TRUE(img.ok()) << f << ": " << img.problem;
      EXPECT_TRUE(img.pixels.equal(opencv_reference(d.file(f), grey))) << f << (grey ? " grey" : " rgb");
    }
}

TEST(ImageDecode, DamagedFilesAreRefused) {
  test::TempDir d;
  const std::string jpg = encode(test_picture(64, 64, CV_8UC3), ".jpg"),
                    png = encode(test_picture(32, 32, CV_8UC3), ".png");
  // OpenCV "decodes" every one of these (grey fill, a warning on stderr): they must all count as bad here.
  // Overwritten entropy data that libjpeg notices (a stray marker: "premature end of data segment"); bit flips that
  // still form valid Huffman codes are undetectable by any decoder and decode to wrong pixels everywhere.
  std::string flipped = jpg;
  flipped.replace(jpg.size() / 2, 8, "\xff\xd0\x12\xff\xc4\x00\xff\x07", 8);
  const std::vector<std::pair<std::string, std::string>> bad{{"half.jpg", jpg.substr(0, jpg.size() / 2)},
                                                             {"cut.jpg", jpg.substr(0, jpg.size() - 20)},
                                                             {"flipped.jpg", flipped},
                                                             {"half.png", png.substr(0, png.size() / 2)},
                                                             {"noend.png", png.substr(0, png.size() - 12)},
                                                             {"crc.png",
                                                              [&] {
                                                                std::string s = png;
                                                                s[png.size() / 2] ^= 1;
                                                                return s;
                                                              }()},
                                                             {"text.jpg", "not an image"},
                                                             {"empty.png", ""}};
  for (const auto& [name, bytes] : bad) {
    d.write(name, bytes);
    const DecodedImage img = read_image(d.file(name), 3);
    EXPECT_FALSE(img.ok()) << name << " decoded as good";
    EXPECT_FALSE(img.pixels.defined()) << name;
  }
  std::string why;
  EXPECT_TRUE(png_intact(png, why)) << why;
  EXPECT_FALSE(png_intact(png.substr(0, png.size() - 5), why));
}

TEST(ImageDecode, OversizedImagesAreReducedOrRefused) {
  // A JPEG over the pixel limit decodes at a DCT scale (1/2 here) instead of taking gigabytes.
  const std::string big = encode(cv::Mat(8200, 8200, CV_8UC1, cv::Scalar(90)), ".jpg");
  const DecodedImage img = decode_image_bytes(big, 1);
  ASSERT_TRUE(img.ok()) << img.problem;
  EXPECT_EQ(img.pixels.size(0), 4100);
  EXPECT_EQ(img.pixels.size(1), 4100);
  // A PNG claiming 20000 x 20000 is refused from its header, before any pixel is allocated.
  std::string png = encode(cv::Mat(2, 2, CV_8UC1, cv::Scalar(1)), ".png");
  const char dims[8] = {0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20};  // 20000, 20000 (big-endian)
  png.replace(16, 8, dims, 8);
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(png.data() + 12), 17);  // "IHDR" + 13
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<char>((crc >> (24 - 8 * i)) & 0xff);
  const DecodedImage huge = decode_image_bytes(png, 3);
  EXPECT_FALSE(huge.ok());
  EXPECT_NE(huge.problem.find("20000x20000"), std::string::npos) << huge.problem;
}
#endif

}  // namespace
}  // namespace moh::datasets
