#include "datasets/image_decode.h"

#include <zlib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/io/atomic_io.h"

#ifdef MOH_WITH_OPENCV
#include <jpeglib.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace moh::datasets {

namespace {

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool has_prefix(const std::string& b, const char* magic, size_t n) {
  return b.size() >= n && std::memcmp(b.data(), magic, n) == 0;
}

#ifdef MOH_WITH_OPENCV

std::string too_large(int64_t w, int64_t h) {
  return "image of " + std::to_string(w) + "x" + std::to_string(h) + " pixels exceeds the " +
         std::to_string(kMaxImagePixels >> 20) + " Mpx limit";
}

// ---- JPEG through libjpeg: warnings (truncation, corrupt entropy data) are counted, never printed ---------------

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  int warnings;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_note(j_common_ptr cinfo, int level) {
  if (level < 0) ++reinterpret_cast<JpegErrors*>(cinfo->err)->warnings;  // level -1: a warning (damaged data)
}

void jpeg_quiet(j_common_ptr) {}

// Plain data only between setjmp and longjmp: the pixel buffer is malloc'd into *out_buf and freed by the caller.
// Returns 0 = decoded, 1 = libjpeg error (message in errors.message), 2 = warnings (damaged), 3 = too large,
// 4 = CMYK output (4 channels in the buffer).
int jpeg_decode_raw(const unsigned char* data, unsigned long size, int grey, unsigned char** out_buf, int* w, int* h,
                    int* c, int* full_w, int* full_h, JpegErrors* errors) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_fail;
  errors->mgr.emit_message = jpeg_note;
  errors->mgr.output_message = jpeg_quiet;
  errors->warnings = 0;
  errors->message[0] = 0;
  *out_buf = nullptr;
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  *full_w = static_cast<int>(cinfo.image_width), *full_h = static_cast<int>(cinfo.image_height);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : grey ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = 1;
  while (static_cast<int64_t>(cinfo.image_width / cinfo.scale_denom) * (cinfo.image_height / cinfo.scale_denom) >
         kMaxImagePixels) {
    if (cinfo.scale_denom == 8) {
      jpeg_destroy_decompress(&cinfo);
      return 3;
    }
    cinfo.scale_denom *= 2;
  }
  jpeg_start_decompress(&cinfo);
  *w = static_cast<int>(cinfo.output_width), *h = static_cast<int>(cinfo.output_height);
  *c = cinfo.output_components;
  const size_t stride = static_cast<size_t>(*w) * static_cast<size_t>(*c);
  *out_buf = static_cast<unsigned char*>(std::malloc(stride * static_cast<size_t>(*h)));
  if (!*out_buf) {
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = *out_buf + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (errors->warnings > 0) return 2;
  return cmyk ? 4 : 0;
}

DecodedImage decode_jpeg(const std::string& bytes, int64_t channels) {
  JpegErrors errors;
  unsigned char* buf = nullptr;
  int w = 0, h = 0, c = 0, fw = 0, fh = 0;
  const int rc = jpeg_decode_raw(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), channels == 1,
                                 &buf, &w, &h, &c, &fw, &fh, &errors);
  DecodedImage out;
  if (rc == 1 || rc == 2 || rc == 3) {
    std::free(buf);
    out.problem = rc == 1   ? std::string("not a decodable JPEG (") + errors.message + ")"
                  : rc == 2 ? "truncated or corrupt JPEG data"
                            : too_large(fw, fh);
    return out;
  }
  // The tensor takes the buffer over (freed with it): no copy of the decoded pixels.
  at::Tensor t = at::from_blob(
      buf, {h, w, c}, [](void* p) { std::free(p); }, at::TensorOptions(at::kByte));
  if (rc == 4) {  // Adobe CMYK (stored inverted): R = C·K/255, G = M·K/255, B = Y·K/255
    const at::Tensor f = t.to(at::kFloat), k = f.narrow(2, 3, 1);
    t = (f.narrow(2, 0, 3) * k / 255.0).round().clamp(0, 255).to(at::kByte);
    if (channels == 1)  // ITU-R BT.601 luma, as OpenCV's RGB2GRAY
      t = (t.to(at::kFloat) * at::tensor({0.299f, 0.587f, 0.114f})).sum(2, true).round().clamp(0, 255).to(at::kByte);
  }
  out.pixels = t.contiguous();
  return out;
}

DecodedImage decode_with_opencv(const std::string& bytes, int64_t channels) {
  DecodedImage out;
  cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<char*>(bytes.data()));
  cv::Mat m =
      cv::imdecode(raw, (channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR) | cv::IMREAD_IGNORE_ORIENTATION);
  if (m.empty()) {
    out.problem = "not a decodable image";
    return out;
  }
  if (static_cast<int64_t>(m.rows) * m.cols > kMaxImagePixels) {
    out.problem = too_large(m.cols, m.rows);
    return out;
  }
  if (channels != 1) cv::cvtColor(m, m, cv::COLOR_BGR2RGB);
  if (!m.isContinuous()) m = m.clone();
  out.pixels = at::from_blob(m.data, {m.rows, m.cols, m.channels()}, at::kByte).clone();
  return out;
}

#endif  // MOH_WITH_OPENCV

}  // namespace

bool png_intact(const std::string& b, std::string& why) {
  static const char kSig[8] = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  if (!has_prefix(b, kSig, 8)) return why = "no PNG signature", false;
  size_t pos = 8;
  bool first = true, idat = false;
  while (true) {
    if (pos + 12 > b.size()) return why = "truncated PNG (no IEND chunk)", false;
    const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + pos;
    const uint32_t len = be32(p);
    if (len > b.size() - pos - 12) return why = "truncated PNG (a chunk runs past the end of the file)", false;
    const std::string type(b.data() + pos + 4, 4);
    if (first && type != "IHDR") return why = "PNG does not start with IHDR", false;
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), p + 4, static_cast<uInt>(len + 4));
    if (crc != be32(p + 8 + len)) return why = "corrupt PNG (CRC mismatch in chunk " + type + ")", false;
    if (type == "IDAT") idat = true;
    pos += 12 + len;
    first = false;
    if (type == "IEND") break;
  }
  if (!idat) return why = "PNG has no image data (IDAT)", false;
  return true;
}

bool can_decode_images() {
#ifdef MOH_WITH_OPENCV
  return true;
#else
  return false;
#endif
}

DecodedImage decode_image_bytes(const std::string& bytes, int64_t channels) {
#ifndef MOH_WITH_OPENCV
  (void)bytes, (void)channels;
  throw UserError("image decoding", "needs OpenCV, which this build was configured without",
                  "rebuild with -DMOH_WITH_OPENCV=ON");
#else
  DecodedImage out;
  if (has_prefix(bytes, "\xff\xd8\xff", 3)) return decode_jpeg(bytes, channels);
  if (has_prefix(bytes, "\x89PNG", 4)) {
    if (!png_intact(bytes, out.problem)) return out;
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    const int64_t w = be32(p + 16), h = be32(p + 20);
    if (w * h > kMaxImagePixels) return out.problem = too_large(w, h), out;
    return decode_with_opencv(bytes, channels);
  }
  if (has_prefix(bytes, "BM", 2) && bytes.size() >= 26) {
    int32_t w = 0, h = 0;
    std::memcpy(&w, bytes.data() + 18, 4), std::memcpy(&h, bytes.data() + 22, 4);
    if (static_cast<int64_t>(std::abs(w)) * std::abs(static_cast<int64_t>(h)) > kMaxImagePixels)
      return out.problem = too_large(std::abs(w), std::abs(static_cast<int64_t>(h))), out;
  }
  return decode_with_opencv(bytes, channels);
#endif
}

DecodedImage read_image(const std::string& path, int64_t channels) {
  std::string bytes;
  try {
    bytes = read_file(path, "image");
  } catch (const UserError& e) {
    DecodedImage out;
    out.problem = e.reason();
    return out;
  }
  if (bytes.empty()) {
    DecodedImage out;
    out.problem = "empty file";
    return out;
  }
  return decode_image_bytes(bytes, channels);
}

}  // namespace moh::datasets
