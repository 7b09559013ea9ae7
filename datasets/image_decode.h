#pragma once
// Image files → pixels, with an exact verdict on damaged files. OpenCV's imread returns a grey-filled image for a
// truncated or corrupted JPEG/PNG (libjpeg only prints "Premature end of JPEG file" and carries on), which would
// count as a good sample. Here JPEGs are decoded with libjpeg directly, and any warning it raises (premature end,
// corrupt data) marks the file as damaged, silently; PNGs are checked chunk by chunk (lengths, CRCs, IHDR ... IEND)
// before OpenCV decodes them; other formats (BMP, WebP, TIFF) go to OpenCV. Images larger than kMaxImagePixels are
// decoded at 1/2 .. 1/8 scale where the format allows it (libjpeg's DCT scaling) and refused otherwise, so a stray
// 20000×20000 file never takes gigabytes. EXIF orientation is not applied (as PIL's ImageFolder loading).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace moh::datasets {

/// Largest decoded image (pixels): 8192 × 8192.
constexpr int64_t kMaxImagePixels = int64_t{8192} * 8192;

/// A decoded image, or why the file is unusable.
struct DecodedImage {
  at::Tensor pixels;    ///< (H, W, 1) grey or (H, W, 3) RGB uint8; undefined when `problem` is set
  std::string problem;  ///< "" = decoded; else e.g. "truncated or corrupt JPEG data", "not an image"
  bool ok() const { return problem.empty(); }
};

/// Whether this build decodes and encodes images (OpenCV; -DMOH_WITH_OPENCV=OFF builds read .npz, latents and the
/// embedded datasets only).
bool can_decode_images();

/// Decodes an image file to `channels` (1 = grey, 3 = RGB).
DecodedImage read_image(const std::string& path, int64_t channels);

/// The same for bytes already in memory (`name` is only used to tell formats apart when the magic is ambiguous).
DecodedImage decode_image_bytes(const std::string& bytes, int64_t channels);

/// Whether PNG bytes are structurally complete: signature, IHDR first, every chunk's length inside the file and CRC
/// right, IDAT present, IEND last. Writes the reason into `why` when not.
bool png_intact(const std::string& bytes, std::string& why);

}  // namespace moh::datasets
