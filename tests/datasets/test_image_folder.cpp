// ImageFolder reader: class order, empty class folders, corrupt images counted and limited, PNG export round trip.
#include "core/error.h"
#include "datasets/image_folder.h"
#include "tests/test_util.h"

namespace moh::datasets {
namespace {

#ifdef MOH_WITH_OPENCV
TEST(ImageFolder, ClassesCorruptAndEmptyFoldersAndRoundTrip) {
  test::TempDir d;
  // 3 classes × 4 grey 6×6 images written by the exporter; class "01_b" then loses its images (empty folder).
  ImageSet set{(at::arange(12 * 36, at::kLong) % 256).to(at::kByte).reshape({12, 6, 6}),
               at::tensor({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}, at::kLong)};
  write_image_folder(d.file("tree/train"), set, {"00_a", "01_b", "02_c"});
  ImageSet back = load_image_folder(d.file("tree"), "train", 1, 0, 0.0);
  ASSERT_EQ(back.size(), 12);
  // Sorted by class, then by file name: class 0 holds images 0, 3, 6, 9.
  EXPECT_TRUE(back.images[0].equal(set.images[0]));
  EXPECT_TRUE(back.images[1].equal(set.images[3]));
  EXPECT_EQ(back.labels[4].item<int64_t>(), 1);
  for (const auto& e : std::filesystem::directory_iterator(d.file("tree/train/01_b")))
    std::filesystem::remove(e.path());
  d.write("tree/train/02_c/zz_corrupt.jpg", "\xff\xd8\xff\xe0 this is not a JPEG");
  DecodeReport r;
  ImageSet partial = load_image_folder(d.file("tree"), "train", 1, 0, 0.5, &r);
  EXPECT_EQ(r.decoded, 8);
  EXPECT_EQ(r.bad, 1);
  EXPECT_EQ(partial.labels[7].item<int64_t>(), 2);  // the empty class keeps its index: "02_c" is still label 2
  EXPECT_THROW(load_image_folder(d.file("tree"), "train", 1, 0, 0.05), UserError);  // 1/9 bad > 5 %
  EXPECT_THROW(load_image_folder(d.file("tree"), "val", 1, 0, 0.5), UserError);     // no such split
  // RGB decoding and resizing to a requested size.
  ImageSet rgb = load_image_folder(d.file("tree"), "train", 3, 12, 0.5);
  EXPECT_EQ(rgb.images.sizes(), (at::IntArrayRef{8, 12, 12, 3}));
}
#endif

TEST(ImageFolder, MissingRootIsAUserError) {
  EXPECT_THROW(scan_image_folder("/nonexistent/root", "train"), UserError);
}

}  // namespace
}  // namespace moh::datasets
