#include "datasets/latents.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_io.h"
#include "core/error.h"
#include "core/safetensors.h"
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
  nlohmann::json j{{"format", "moh-latents"}, {"version", 1},       {"count", m.count},
                   {"shards", m.shards},       {"channels", m.channels}, {"size", m.size},
                   {"image_size", m.image_size}, {"scale", m.scale},       {"classes", m.classes},
                   {"vae", m.vae},             {"vae_sha256", m.vae_sha256}, {"source", m.source}};
  write_file_atomic(dir + "/meta.json", j.dump(1) + "\n");
}

LatentMeta read_latent_meta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  if (!fs::exists(path)) throw UserError("latents " + dir, "no meta.json", kHint);
  LatentMeta m;
  try {
    auto j = nlohmann::json::parse(read_file(path));
    if (j.at("format") != "moh-latents" || j.at("version") != 1) throw UserError(path, "not a moh-latents v1 directory", kHint);
    m.count = j.at("count"), m.channels = j.at("channels"), m.size = j.at("size");
    m.shards = j.at("shards").get<std::vector<int64_t>>();
    m.image_size = j.at("image_size"), m.scale = j.at("scale");
    m.classes = j.at("classes").get<std::vector<std::string>>();
    m.vae = j.at("vae"), m.vae_sha256 = j.at("vae_sha256"), m.source = j.at("source");
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("malformed: ") + e.what(), kHint);
  }
  int64_t sum = 0;
  for (int64_t n : m.shards) sum += n < 0 ? m.count + 1 : n;
  if (m.count <= 0 || sum != m.count || m.channels <= 0 || m.size <= 0 || !(m.scale > 0))
    throw UserError(path, "count, shards, channels, size and scale must be positive and consistent", kHint);
  return m;
}

LatentShard read_latent_shard(const std::string& dir, const LatentMeta& meta, int64_t i) {
  const std::string path = latent_shard_path(dir, i);
  if (!fs::exists(path)) throw UserError("latents " + dir, "shard " + std::to_string(i) + " is missing", "extraction unfinished? re-run it");
  SafetensorsFile f = load_safetensors(path);
  const int64_t n = meta.shards.at(static_cast<size_t>(i));
  auto get = [&](const char* name, at::ScalarType dtype, std::vector<int64_t> shape) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) throw UserError(path, std::string("no tensor '") + name + "'", kHint);
    if (it->second.scalar_type() != dtype || it->second.sizes().vec() != shape)
      throw UserError(path, std::string("tensor '") + name + "' is " + c10::toString(it->second.scalar_type()) + " " +
                                c10::str(it->second.sizes()) + ", expected " + c10::toString(dtype) + " " + c10::str(shape),
                      kHint);
    return it->second;
  };
  const std::vector<int64_t> shape{n, meta.channels, meta.size, meta.size};
  LatentShard s{get("mean", at::kHalf, shape), get("std", at::kHalf, shape), get("mean_flip", at::kHalf, shape),
                get("std_flip", at::kHalf, shape), get("labels", at::kLong, {n})};
  return s;
}

LatentLoader::LatentLoader(std::string dir, const LatentMeta& meta, int64_t batch_size, uint64_t seed, int64_t epoch,
                           int64_t limit, int64_t window, int rank, int world, int64_t start_batch)
    : dir_(std::move(dir)), meta_(meta), batch_(batch_size), seed_(seed), epoch_(epoch), window_(std::max<int64_t>(1, window)),
      rank_(rank), world_(world) {
  if (batch_ <= 0) throw UserError("config: data.batch_size", "must be positive", "");
  count_ = limit > 0 ? std::min(limit, meta_.count) : meta_.count;
  int64_t needed = 0;  // shards past a limit are never read
  for (int64_t first = 0; needed < meta_.num_shards() && first < count_; ++needed) {
    offsets_.push_back(first);
    first += meta_.shards[static_cast<size_t>(needed)];
  }
  order_ = epoch_order(needed, seed, epoch, /*shuffle=*/true);
  for (int64_t b = 0; b < start_batch && ensure_batch(); ++b) pos_ += batch_, served_ += batch_;
}

bool LatentLoader::refill() {
  // Pools the leftovers with the next `window` shards and shuffles the pool.
  std::vector<at::Tensor> m, s, mf, sf, l;
  if (mean_.defined() && pos_ < mean_.size(0)) {
    m.push_back(mean_.slice(0, pos_)), s.push_back(std_.slice(0, pos_)), mf.push_back(mean_flip_.slice(0, pos_));
    sf.push_back(std_flip_.slice(0, pos_)), l.push_back(labels_.slice(0, pos_));
  }
  const size_t before = m.size();
  for (int64_t k = 0; k < window_ && next_shard_ < order_.size(); ++k, ++next_shard_) {
    const int64_t i = order_[next_shard_];
    LatentShard sh = read_latent_shard(dir_, meta_, i);
    const int64_t keep = std::min(sh.labels.size(0), count_ - offsets_[static_cast<size_t>(i)]);  // a limit cuts the last shard
    m.push_back(sh.mean.narrow(0, 0, keep)), s.push_back(sh.std.narrow(0, 0, keep));
    mf.push_back(sh.mean_flip.narrow(0, 0, keep)), sf.push_back(sh.std_flip.narrow(0, 0, keep));
    l.push_back(sh.labels.narrow(0, 0, keep));
  }
  if (m.size() == before) return false;
  mean_ = at::cat(m), std_ = at::cat(s), mean_flip_ = at::cat(mf), std_flip_ = at::cat(sf), labels_ = at::cat(l);
  const std::vector<int64_t> perm = epoch_order(mean_.size(0), mix_seed(seed_, next_shard_), epoch_, /*shuffle=*/true);
  const at::Tensor idx = at::tensor(perm, at::kLong);
  mean_ = mean_.index_select(0, idx), std_ = std_.index_select(0, idx);
  mean_flip_ = mean_flip_.index_select(0, idx), std_flip_ = std_flip_.index_select(0, idx);
  labels_ = labels_.index_select(0, idx);
  pos_ = 0;
  return true;
}

bool LatentLoader::ensure_batch() {
  if (served_ + batch_ > count_) return false;
  while (!mean_.defined() || mean_.size(0) - pos_ < batch_)
    if (!refill()) return false;
  return true;
}

bool LatentLoader::next(at::Tensor& z, at::Tensor& labels) {
  if (!ensure_batch()) return false;
  auto take = [&](const at::Tensor& t) { return t.slice(0, pos_, pos_ + batch_).to(at::kFloat); };
  const at::Tensor flip = (at::rand({batch_}) < 0.5).view({batch_, 1, 1, 1});  // (B,1,1,1) mirror choice
  const at::Tensor mean = at::where(flip, take(mean_flip_), take(mean_));
  const at::Tensor std = at::where(flip, take(std_flip_), take(std_));
  z = (mean + std * at::randn_like(mean)) * meta_.scale;  // (B, C, H, W)
  labels = labels_.slice(0, pos_, pos_ + batch_).clone();
  if (world_ > 1) z = z.slice(0, rank_, batch_, world_), labels = labels.slice(0, rank_, batch_, world_);  // rank's rows
  pos_ += batch_;
  served_ += batch_;
  return true;
}

}  // namespace moh::datasets
