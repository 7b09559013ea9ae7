#include "datasets/loader.h"

#include <algorithm>

#include "datasets/augment.h"

namespace moh::datasets {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {
struct SplitMix {
  uint64_t s;
  uint64_t next() { return s = mix_seed(s, 1); }
  uint64_t below(uint64_t n) { return next() % n; }  // bias < 2^-40 for dataset sizes
};
}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle, int rank, int world) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (shuffle) {
    SplitMix rng{mix_seed(seed, static_cast<uint64_t>(epoch))};
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  if (world > 1) {
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < n; i += world) mine.push_back(order[i]);
    return mine;
  }
  return order;
}

std::vector<int64_t> limited_subset(int64_t n, int64_t limit, uint64_t seed) {
  if (limit <= 0 || limit >= n) return epoch_order(n, seed, 0, /*shuffle=*/false);
  constexpr uint64_t kSubsetStream = 0x73756273ull;  // "subs": a stream of its own, unrelated to the epoch orders
  std::vector<int64_t> pick = epoch_order(n, mix_seed(seed, kSubsetStream), 0, /*shuffle=*/true);
  pick.resize(static_cast<size_t>(limit));
  std::sort(pick.begin(), pick.end());
  return pick;
}

std::pair<at::Tensor, at::Tensor> make_batch(const ImageSet& set, const std::vector<int64_t>& indices,
                                             const ImageTransform& tf, bool train, uint64_t seed, int64_t epoch) {
  const int64_t B = static_cast<int64_t>(indices.size());
  const bool color = set.images.dim() == 4;
  const int64_t H = set.images.size(1), W = set.images.size(2), C = color ? set.images.size(3) : 1, S = tf.size;
  at::Tensor out = at::zeros({B, C, S, S}, at::kFloat);
  at::Tensor labels = at::empty({B}, at::kLong);
  const uint8_t* src = set.images.data_ptr<uint8_t>();
  const int64_t* lab = set.labels.data_ptr<int64_t>();
  float* dst = out.data_ptr<float>();
  int64_t* lab_out = labels.data_ptr<int64_t>();
  const float scale = static_cast<float>(1.0 / (255.0 * tf.std)), offset = static_cast<float>(-tf.mean / tf.std);
  // A plain loop: this runs on the loader's own thread, beside the training step. An at::parallel_for here would
  // start a second OpenMP team that spin-waits against the training step's team on the same cores.
  {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t idx = indices[b];
      lab_out[b] = lab[idx];
      int64_t dy = 0, dx = 0;
      bool flip = false;
      uint64_t erase_seed = 0;
      if (train) {
        SplitMix rng{mix_seed(mix_seed(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(idx))};
        if (tf.shift > 0) {
          dy = static_cast<int64_t>(rng.below(2 * tf.shift + 1)) - tf.shift;
          dx = static_cast<int64_t>(rng.below(2 * tf.shift + 1)) - tf.shift;
        }
        flip = tf.hflip && (rng.next() & 1);
        if (tf.erase_prob > 0) erase_seed = rng.next();
      }
      const int64_t oy = (S - H) / 2 + dy, ox = (S - W) / 2 + dx;  // placement of the image in the S×S canvas
      float* img = dst + b * C * S * S;
      // Every canvas pixel is either the normalised zero (padding) or a source pixel.
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = 0; y < S; ++y)
          for (int64_t x = 0; x < S; ++x) {
            const int64_t sy = y - oy, sx0 = x - ox, sx = flip ? W - 1 - sx0 : sx0;
            float v = offset;
            if (sy >= 0 && sy < H && sx0 >= 0 && sx0 < W)
              v = static_cast<float>(src[((idx * H + sy) * W + sx) * C + c]) * scale + offset;
            img[(c * S + y) * S + x] = v;
          }
      if (erase_seed) {
        AugRng rng(erase_seed);
        at::Tensor sample = out[b];
        random_erase_(sample, tf.erase_prob, rng);
      }
    }
  }
  return {out, labels};
}

EpochLoader::EpochLoader(const ImageSet& set, ImageTransform tf, int64_t batch_size, bool train, uint64_t seed,
                         int64_t epoch, int64_t start_batch, bool drop_last, int prefetch, int rank, int world)
    : set_(set),
      tf_(tf),
      batch_size_(batch_size),
      epoch_(epoch),
      next_batch_(start_batch),
      train_(train),
      seed_(seed),
      prefetch_(static_cast<size_t>(std::max(1, prefetch))) {
  order_ = epoch_order(set.size(), seed, epoch, train, rank, world);
  const int64_t n = static_cast<int64_t>(order_.size());
  num_batches_ = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
  worker_ = std::thread([this] { produce(); });
}

EpochLoader::~EpochLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void EpochLoader::produce() {
  for (int64_t b = next_batch_; b < num_batches_; ++b) {
    const int64_t begin = b * batch_size_, end = std::min<int64_t>(begin + batch_size_, order_.size());
    std::vector<int64_t> idx(order_.begin() + begin, order_.begin() + end);
    auto batch = make_batch(set_, idx, tf_, train_, seed_, epoch_);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || ready_.size() < prefetch_; });
    if (stop_) return;
    ready_.push_back(std::move(batch));
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

bool EpochLoader::next(at::Tensor& x, at::Tensor& y) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || done_; });
  if (ready_.empty()) return false;
  std::tie(x, y) = ready_.front();
  ready_.pop_front();
  cv_.notify_all();
  return true;
}

}  // namespace moh::datasets
