#pragma once
// TensorBoard event files written by the toolkit itself: TFRecord framing (length, masked CRC-32C of the length, the
// record, masked CRC-32C of the record) around the few protobuf messages a run needs — Event {wall_time, step,
// file_version, summary, session_log} and Summary.Value {tag, metadata.plugin_data, simple_value, image, tensor of
// strings}. Hand-encoded because the dependency it would replace (protobuf + TensorFlow's .proto files, or a C++
// TensorBoard logger) is in neither Debian nor PyPI as a C++ library, and these messages are a few dozen bytes of
// wire format. The `tensorboard` package's reader is the reference (tests/core/ref_tensorboard.py).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace moh {

/// CRC-32C (Castagnoli, reflected 0x82F63B78), as TFRecord uses it; "123456789" -> 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
/// TFRecord's masked CRC: rotate right by 15 and add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

/// A PNG (8-bit, colour type 0 grey, 2 RGB or 6 RGBA for 1, 3, 4 channels; zlib-deflated rows with filter 0) of
/// `pixels` (h × w × channels, row-major).
std::string encode_png(const uint8_t* pixels, int64_t height, int64_t width, int channels);

/// One event file in `dir` (created if absent): events.out.tfevents.<seconds>.<host>.<pid>.moh, its first record the
/// file version. Each append is flushed, so a killed process leaves every whole record readable.
class TensorBoardWriter {
 public:
  /// `resumed_step`: the run continues after a checkpoint at that step; a SessionLog START at step + 1 makes
  /// TensorBoard drop what an earlier process logged past the checkpoint (its steps come again).
  explicit TensorBoardWriter(const std::string& dir, std::optional<int64_t> resumed_step = std::nullopt);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  /// `png`: an encoded PNG of height × width × channels.
  void add_image(const std::string& tag, const std::string& png, int64_t height, int64_t width, int channels,
                 int64_t step);
  /// An encoded PNG file's bytes; its size and channels are read from its header (runtime_error if not a PNG).
  void add_png(const std::string& tag, const std::string& png, int64_t step);
  /// Markdown text (the text plugin).
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  /// A matrix of non-negative values as a heat map image (rows top to bottom, `cell` pixels per entry, viridis from
  /// 0 to the largest entry; rows shorter than the longest end in dark grey).
  void add_heatmap(const std::string& tag, const std::vector<std::vector<double>>& rows, int64_t step, int cell = 16);
  /// Pushes what was appended to the disk (every add_* does).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void append_event(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace moh
