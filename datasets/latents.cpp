#include "datasets/latents.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "datasets/loader.h"

namespace moh::datasets {

namespace fs = std::filesystem;

namespace {
constexpr const char* kHint = "create it with `moh extract-latents CONFIG.yaml --out DIR`";
}

std::string latent_shard_path(const std::string& dir, int64_t i) {
  char name[40];
  std::snprintf(name, sizeof name, "/shard_%05lld.safetensors", static_cast<long long>(i));
  return dir + name;
}

void write_latent_meta(const std::string& dir, const LatentMeta& m) {
  nlohmann::json j{{"format", "moh-latents"}, {"version", 1},   {"count", m.count},           {"shards", m.shards},
                   {"channels", m.channels},  {"size", m.size}, {"image_size", m.image_size}, {"scale", m.scale},
                   {"classes", m.classes},    {"vae", m.vae},   {"vae_sha256", m.vae_sha256}, {"source", m.source}};
  if (m.images) j["images"] = true;  // absent in directories written without --keep-images (and before it existed)
  if (!m.channel_mean.empty()) j["channel_mean"] = m.channel_mean, j["channel_std"] = m.channel_std;
  write_file_atomic(dir + "/meta.json", j.dump(1) + "\n");
}

LatentMeta read_latent_meta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  if (!fs::exists(path)) throw UserError("latents " + dir, "no meta.json", kHint);
  LatentMeta m;
  try {
    auto j = nlohmann::json::parse(read_file(path));
    if (j.at("format") != "moh-latents" || j.at("version") != 1)
      throw UserError(path, "not a moh-latents v1 directory", kHint);
    m.count = j.at("count");
    m.channels = j.at("channels");
    m.size = j.at("size");
    m.shards = j.at("shards").get<std::vector<int64_t>>();
    m.image_size = j.at("image_size");
    m.scale = j.at("scale");
    m.classes = j.at("classes").get<std::vector<std::string>>();
    m.vae = j.at("vae");
    m.vae_sha256 = j.at("vae_sha256");
    m.source = j.at("source");
    m.images = j.value("images", false);
    m.channel_mean = j.value("channel_mean", std::vector<double>{});
    m.channel_std = j.value("channel_std", std::vector<double>{});
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("malformed: ") + e.what(), kHint);
  }
  int64_t sum = 0;
  for (int64_t n : m.shards) sum += n < 0 ? m.count + 1 : n;
  if (m.count <= 0 || sum != m.count || m.channels <= 0 || m.size <= 0 || !(m.scale > 0))
    throw UserError(path, "count, shards, channels, size and scale must be positive and consistent", kHint);
  const bool stats = !m.channel_mean.empty() || !m.channel_std.empty();
  if (stats &&
      (m.channel_mean.size() != static_cast<size_t>(m.channels) || m.channel_std.size() != m.channel_mean.size() ||
       std::any_of(m.channel_std.begin(), m.channel_std.end(), [](double v) { return !(v > 0); })))
    throw UserError(path, "channel_mean and channel_std need one value per channel, std > 0", kHint);
  return m;
}

void latent_channel_stats(const std::string& dir, LatentMeta& meta) {
  at::Tensor sum_m = at::zeros({meta.channels}, at::kDouble), sum_m2 = at::zeros_like(sum_m),
             sum_s2 = at::zeros_like(sum_m);
  int64_t values = 0;  // per channel
  for (int64_t k = 0; k < meta.num_shards(); ++k) {
    const SafetensorsReader shard(latent_shard_path(dir, k));
    const SafetensorsEntry *m = shard.find("mean"), *s = shard.find("std");
    if (!m || !s) throw UserError("latents " + dir, shard.path() + " has no mean/std", kHint);
    const at::Tensor mean = shard.read(*m).to(at::kDouble), std = shard.read(*s).to(at::kDouble);  // (n, C, H, W)
    sum_m += mean.sum({0, 2, 3});
    sum_m2 += mean.square().sum({0, 2, 3});
    sum_s2 += std.square().sum({0, 2, 3});
    values += mean.size(0) * mean.size(2) * mean.size(3);
  }
  const auto n = static_cast<double>(values);
  const at::Tensor mu = sum_m / n, var = sum_m2 / n + sum_s2 / n - mu.square();
  meta.channel_mean = std::vector<double>(mu.data_ptr<double>(), mu.data_ptr<double>() + meta.channels);
  const at::Tensor sd = var.clamp_min(0).sqrt().contiguous();
  meta.channel_std = std::vector<double>(sd.data_ptr<double>(), sd.data_ptr<double>() + meta.channels);
}

namespace {
// (1, C, 1, 1) of `v` on x's device and dtype.
at::Tensor per_channel(const std::vector<double>& v, const at::Tensor& x) {
  return at::tensor(v, at::kDouble).view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
}
}  // namespace

at::Tensor LatentNorm::to_model(const at::Tensor& z) const {
  if (mean.empty()) return z * scale;
  return (z - per_channel(mean, z)) / per_channel(std, z) * scale;
}

at::Tensor LatentNorm::to_vae(const at::Tensor& x) const {
  if (mean.empty()) return x / scale;
  return x / scale * per_channel(std, x) + per_channel(mean, x);
}

namespace {
// Shard files kept open at once (an ImageNet extraction has ~310 shards of 4,096); beyond it readers are reopened.
constexpr size_t kMaxOpenShards = 512;
const char* const kMomentNames[4] = {"mean", "std", "mean_flip", "std_flip"};
constexpr int kImages = 4;  // the images' entry, after the four moments
}  // namespace

struct LatentStore::Shard {
  std::string path;
  int64_t rows = 0;
  mutable std::mutex mu;
  mutable std::unique_ptr<SafetensorsReader> reader;                                           // opened on first use
  mutable const SafetensorsEntry* moments[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};  // + images
};

namespace {
// Opens a shard and checks its tensors against the metadata (names, dtypes, shapes); returns the reader.
std::unique_ptr<SafetensorsReader> open_shard(const std::string& dir, const LatentMeta& meta, int64_t i,
                                              const SafetensorsEntry* moments[5], const SafetensorsEntry** labels) {
  const std::string path = latent_shard_path(dir, i);
  if (!fs::exists(path))
    throw UserError("latents " + dir, "shard " + std::to_string(i) + " is missing", "extraction unfinished? re-run it");
  auto r = std::make_unique<SafetensorsReader>(path);
  const int64_t n = meta.shards.at(static_cast<size_t>(i));
  auto get = [&](const char* name, at::ScalarType dtype, const std::vector<int64_t>& shape) {
    const SafetensorsEntry* e = r->find(name);
    if (!e) throw UserError(path, std::string("no tensor '") + name + "'", kHint);
    if (e->dtype != dtype || e->shape != shape)
      throw UserError(path,
                      std::string("tensor '") + name + "' is " + c10::toString(e->dtype) + " " +
                          c10::str(c10::IntArrayRef(e->shape)) + ", expected " + c10::toString(dtype) + " " +
                          c10::str(c10::IntArrayRef(shape)),
                      kHint);
    return e;
  };
  const std::vector<int64_t> shape{n, meta.channels, meta.size, meta.size};
  for (int k = 0; k < 4; ++k) moments[k] = get(kMomentNames[k], at::kHalf, shape);
  moments[kImages] = meta.images ? get("images", at::kByte, {n, meta.image_size, meta.image_size, 3}) : nullptr;
  if (labels) *labels = get("labels", at::kLong, {n});
  return r;
}
}  // namespace

LatentStore::LatentStore(std::string dir, const LatentMeta& meta) : dir_(std::move(dir)), meta_(meta) {
  first_.push_back(0);
  for (int64_t n : meta_.shards) first_.push_back(first_.back() + n);
  labels_.resize(static_cast<size_t>(meta_.count));
  for (int64_t s = 0; s < meta_.num_shards(); ++s) {
    auto sh = std::make_unique<Shard>();
    sh->path = latent_shard_path(dir_, s);
    sh->rows = meta_.shards[static_cast<size_t>(s)];
    const SafetensorsEntry* lab = nullptr;
    auto reader = open_shard(dir_, meta_, s, sh->moments, &lab);
    reader->read_rows(*lab, 0, sh->rows, labels_.data() + first_[static_cast<size_t>(s)]);
    if (static_cast<size_t>(s) < kMaxOpenShards) sh->reader = std::move(reader);
    shards_.push_back(std::move(sh));
  }
  for (int64_t y : labels_)
    if (y < 0) throw UserError("latents " + dir_, "negative label " + std::to_string(y), kHint);
}

LatentStore::~LatentStore() = default;

const LatentStore::Shard& LatentStore::shard(int64_t s) const {
  const Shard& sh = *shards_[static_cast<size_t>(s)];
  std::lock_guard<std::mutex> lock(sh.mu);
  if (!sh.reader) {  // beyond kMaxOpenShards: open for this read (the file handle closes with the next batch's)
    const SafetensorsEntry* m[5];
    sh.reader = open_shard(dir_, meta_, s, m, nullptr);
    for (int k = 0; k < 5; ++k) sh.moments[k] = m[k];
  }
  return sh;
}

void LatentStore::read_entries(const std::vector<int64_t>& index, const std::vector<int>& entries,
                               const std::vector<at::Tensor*>& out, int64_t row_bytes) const {
  for (size_t j = 0; j < index.size(); ++j) {
    const int64_t i = index[j];
    TORCH_CHECK(i >= 0 && i < meta_.count, "LatentStore::read: image index out of range");
    const auto s = static_cast<int64_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
    const Shard& sh = shard(s);
    for (size_t k = 0; k < entries.size(); ++k)
      sh.reader->read_rows(*sh.moments[entries[k]], i - first_[static_cast<size_t>(s)], 1,
                           static_cast<char*>(out[k]->data_ptr()) + static_cast<int64_t>(j) * row_bytes);
  }
  if (meta_.num_shards() > static_cast<int64_t>(kMaxOpenShards))  // close what opened beyond the budget
    for (size_t s = kMaxOpenShards; s < shards_.size(); ++s) {
      std::lock_guard<std::mutex> lock(shards_[s]->mu);
      shards_[s]->reader.reset();
    }
}

void LatentStore::read(const std::vector<int64_t>& index, at::Tensor& mean, at::Tensor& std, at::Tensor& mean_flip,
                       at::Tensor& std_flip) const {
  const auto n = static_cast<int64_t>(index.size());
  const std::vector<int64_t> shape{n, meta_.channels, meta_.size, meta_.size};
  for (auto* t : {&mean, &std, &mean_flip, &std_flip}) *t = at::empty(shape, at::kHalf);
  read_entries(index, {0, 1, 2, 3}, {&mean, &std, &mean_flip, &std_flip}, meta_.channels * meta_.size * meta_.size * 2);
}

at::Tensor LatentStore::read_images(const std::vector<int64_t>& index) const {
  TORCH_CHECK(meta_.images, "LatentStore::read_images: the latents hold no images");
  const int64_t p = meta_.image_size;
  at::Tensor images = at::empty({static_cast<int64_t>(index.size()), p, p, 3}, at::kByte);
  read_entries(index, {kImages}, {&images}, p * p * 3);
  return images;
}

LatentLoader::LatentLoader(std::shared_ptr<const LatentStore> store, int64_t batch_size, uint64_t seed, int64_t epoch,
                           int64_t limit, int rank, int world, int64_t start_batch, bool with_images)
    : store_(std::move(store)),
      batch_(batch_size),
      next_batch_(start_batch),
      with_images_(with_images),
      rank_(rank),
      world_(world) {
  TORCH_CHECK(!with_images_ || store_->meta().images, "LatentLoader: the latents hold no images");
  if (batch_ <= 0) throw UserError("config: data.batch_size", "must be positive", "");
  const std::vector<int64_t> subset = limited_subset(store_->count(), limit, seed);
  const std::vector<int64_t> perm = epoch_order(static_cast<int64_t>(subset.size()), seed, epoch, /*shuffle=*/true);
  order_.reserve(subset.size());
  for (int64_t p : perm) order_.push_back(subset[static_cast<size_t>(p)]);
}

bool LatentLoader::next(at::Tensor& z, at::Tensor& labels) {
  if (next_batch_ >= num_batches()) return false;
  const int64_t first = next_batch_ * batch_;
  std::vector<int64_t> mine;  // this rank's rows of the global batch, as image indices
  for (int64_t j = rank_; j < batch_; j += world_) mine.push_back(order_[static_cast<size_t>(first + j)]);
  at::Tensor m, s, mf, sf;
  store_->read(mine, m, s, mf, sf);
  const auto rows = static_cast<int64_t>(mine.size());
  // Draws of the global batch (every rank alike), then this rank's rows: (B,1,1,1) mirror choice, ε (B, C, H, W).
  const LatentMeta& meta = store_->meta();
  at::Tensor flip = at::rand({batch_}) < 0.5;
  at::Tensor eps = at::randn({batch_, meta.channels, meta.size, meta.size});
  if (world_ > 1) {
    flip = flip.slice(0, rank_, batch_, world_);
    eps = eps.slice(0, rank_, batch_, world_);
  }
  flip = flip.view({rows, 1, 1, 1});
  const at::Tensor mean = at::where(flip, mf.to(at::kFloat), m.to(at::kFloat));
  const at::Tensor std = at::where(flip, sf.to(at::kFloat), s.to(at::kFloat));
  z = meta.norm().to_model(mean + std * eps);  // (B, C, H, W)
  if (with_images_) {                          // (B, 3, P, P) in [-1, 1], mirrored with the latent
    const at::Tensor x = store_->read_images(mine).permute({0, 3, 1, 2}).to(at::kFloat) / 127.5 - 1.0;
    images_ = at::where(flip, x.flip({3}), x);
  }
  labels = at::empty({rows}, at::kLong);
  int64_t* y = labels.data_ptr<int64_t>();
  for (int64_t j = 0; j < rows; ++j) y[j] = store_->label(mine[static_cast<size_t>(j)]);
  ++next_batch_;
  return true;
}

}  // namespace moh::datasets
