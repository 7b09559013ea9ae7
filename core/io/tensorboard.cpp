#include "core/io/tensorboard.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace moh {
namespace fs = std::filesystem;

namespace {

// ---- protobuf wire format: what the messages below need, nothing more ----
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire);
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
template <class T>  // little-endian fixed-width (double: wire type 1, float: wire type 5)
void put_fixed(std::string& out, int field, T v) {
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Event {wall_time = 1, step = 2, <field> = payload}
std::string event(int64_t step, int field, const std::string& payload) {
  std::string e;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_fixed(e, 1, now);
  put_int(e, 2, step);
  put_bytes(e, field, payload);
  return e;
}
// Summary {value = 1: Value {tag = 1, <value>}}
std::string summary(const std::string& value_without_tag, const std::string& tag) {
  std::string v;
  put_bytes(v, 1, tag);
  v += value_without_tag;
  std::string s;
  put_bytes(s, 1, v);
  return s;
}

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// The newest <seconds> among the event files in `dir` (0 if none): a new file must sort after them, since
// TensorBoard reads a directory's files in name order and a restart's START must come after what it purges.
int64_t newest_event_seconds(const std::string& dir) {
  int64_t newest = 0;
  const std::string prefix = "events.out.tfevents.";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    try {
      newest = std::max<int64_t>(newest, std::stoll(name.substr(prefix.size())));
    } catch (const std::exception&) {  // not ours: ignore
    }
  }
  return newest;
}

// viridis at a few anchors, linearly between them: t in [0, 1] -> RGB
void viridis(double t, uint8_t* rgb) {
  static const double a[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(std::lround(a[i][c] + f * (a[i + 1][c] - a[i][c])));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_png(const uint8_t* pixels, int64_t height, int64_t width, int channels) {
  if (channels != 1 && channels != 3 && channels != 4) throw std::invalid_argument("encode_png: 1, 3 or 4 channels");
  std::string raw;  // each row: filter byte 0, then the row
  const size_t row = static_cast<size_t>(width) * channels;
  raw.reserve((row + 1) * height);
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(pixels) + y * row, row);
  }
  uLongf zsize = compressBound(raw.size());
  std::string z(zsize, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &zsize, reinterpret_cast<const Bytef*>(raw.data()), raw.size(),
                6) != Z_OK)
    throw std::runtime_error("encode_png: deflate failed");
  z.resize(zsize);
  auto be32 = [](std::string& out, uint32_t v) {
    for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::string png("\x89PNG\r\n\x1a\n", 8);
  auto chunk = [&](const char* type, const std::string& body) {
    be32(png, static_cast<uint32_t>(body.size()));
    const std::string typed = std::string(type, 4) + body;
    png += typed;
    be32(png, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(typed.data()), typed.size())));
  };
  std::string ihdr;
  be32(ihdr, static_cast<uint32_t>(width));
  be32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string{8, static_cast<char>(channels == 1 ? 0 : channels == 3 ? 2 : 6), 0, 0, 0};
  chunk("IHDR", ihdr);
  chunk("IDAT", z);
  chunk("IEND", "");
  return png;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, std::optional<int64_t> resumed_step) {
  fs::create_directories(dir);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(std::max(now, newest_event_seconds(dir) + 1)) + "." + host +
          "." + std::to_string(getpid()) + ".moh";
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw std::runtime_error("cannot create TensorBoard event file " + path_);
  append_event(event(0, 3, "brain.Event:2"));
  if (resumed_step) {
    std::string session_log;
    put_int(session_log, 1, 1);  // SessionLog.status = START
    append_event(event(*resumed_step + 1, 7, session_log));
  }
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::append_event(const std::string& e) {
  std::string len(8, '\0');  // uint64, little-endian
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((static_cast<uint64_t>(e.size()) >> (8 * i)) & 0xff);
  std::string rec = len;
  put_le32(rec, masked_crc32c(len.data(), len.size()));
  rec += e;
  put_le32(rec, masked_crc32c(e.data(), e.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    throw std::runtime_error("cannot write TensorBoard event file " + path_);
}

void TensorBoardWriter::flush() {
  std::fflush(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_fixed(v, 2, static_cast<float>(value));  // Value.simple_value
  append_event(event(step, 5, summary(v, tag)));
  flush();
}

void TensorBoardWriter::add_image(const std::string& tag, const std::string& png, int64_t height, int64_t width,
                                  int channels, int64_t step) {
  std::string image;  // Summary.Image {height, width, colorspace, encoded_image_string}
  put_int(image, 1, height);
  put_int(image, 2, width);
  put_int(image, 3, channels);
  put_bytes(image, 4, png);
  std::string v;
  put_bytes(v, 4, image);
  append_event(event(step, 5, summary(v, tag)));
  flush();
}

void TensorBoardWriter::add_png(const std::string& tag, const std::string& png, int64_t step) {
  if (png.size() < 33 || png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0 || png.compare(12, 4, "IHDR") != 0)
    throw std::runtime_error("TensorBoard image " + tag + ": not a PNG");
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(png[at + i]);
    return static_cast<int64_t>(v);
  };
  const int colour = static_cast<uint8_t>(png[25]);  // 0 grey, 2 RGB, 4 grey + alpha, 6 RGBA
  add_image(tag, png, be32(20), be32(16), colour == 0 ? 1 : colour == 2 ? 3 : colour == 4 ? 2 : 4, step);
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  std::string plugin, metadata, shape, tensor, v;
  put_bytes(plugin, 1, "text");  // PluginData.plugin_name
  put_bytes(metadata, 1, plugin);
  put_int(tensor, 1, 7);        // TensorProto.dtype = DT_STRING
  put_bytes(tensor, 2, shape);  // a scalar: no dims
  put_bytes(tensor, 8, text);   // string_val
  put_bytes(v, 9, metadata);
  put_bytes(v, 8, tensor);
  append_event(event(step, 5, summary(v, tag)));
  flush();
}

void TensorBoardWriter::add_heatmap(const std::string& tag, const std::vector<std::vector<double>>& rows, int64_t step,
                                    int cell) {
  size_t cols = 0;
  double top = 0;
  for (const auto& r : rows) {
    cols = std::max(cols, r.size());
    for (double x : r) top = std::max(top, x);
  }
  if (rows.empty() || cols == 0) return;
  const int64_t h = static_cast<int64_t>(rows.size()) * cell, w = static_cast<int64_t>(cols) * cell;
  std::vector<uint8_t> px(static_cast<size_t>(h * w * 3), 40);  // ragged rows: dark grey past a row's end
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j) {
      uint8_t rgb[3];
      viridis(top > 0 ? rows[i][j] / top : 0, rgb);
      for (int y = 0; y < cell; ++y)
        for (int x = 0; x < cell; ++x) std::memcpy(&px[((i * cell + y) * w + j * cell + x) * 3], rgb, 3);
    }
  add_image(tag, encode_png(px.data(), h, w, 3), h, w, 3, step);
}

}  // namespace moh
