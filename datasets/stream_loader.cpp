#include "datasets/stream_loader.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "core/error.h"
#include "core/platform/memory_preflight.h"
#include "datasets/image_decode.h"
#include "datasets/loader.h"

namespace moh::datasets {

std::vector<int64_t> repeated_order(int64_t n, int64_t repeats, uint64_t seed, int64_t epoch, bool shuffle, int rank,
                                    int world) {
  if (repeats <= 1) return epoch_order(n, seed, epoch, shuffle, rank, world);
  const std::vector<int64_t> perm = epoch_order(n, seed, epoch, shuffle);
  std::vector<int64_t> rep;
  rep.reserve(static_cast<size_t>(n * repeats));
  for (int64_t i : perm)
    for (int64_t r = 0; r < repeats; ++r) rep.push_back(i);
  const int64_t per_rank = (n * repeats + world - 1) / world, total = per_rank * world;
  for (int64_t i = 0; static_cast<int64_t>(rep.size()) < total; ++i) rep.push_back(rep[static_cast<size_t>(i)]);
  const int64_t selected = n >= 256 ? n / 256 * 256 / world : n / world;
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total && static_cast<int64_t>(mine.size()) < selected; i += world)
    mine.push_back(rep[static_cast<size_t>(i)]);
  return mine;
}

StreamLoader::StreamLoader(const ImageFolderIndex& index, SampleTransformOptions transform, StreamOptions options)
    : index_(index), tf_(std::move(transform)), o_(options) {
  const auto n = static_cast<int64_t>(index.files.size());  // a limit is applied to the index (limit_image_folder)
  order_ = repeated_order(n, o_.train ? o_.repeats : 1, o_.seed, o_.epoch, o_.train, o_.rank, o_.world);
  const auto m = static_cast<int64_t>(order_.size());
  num_batches_ = o_.drop_last ? m / o_.batch_size : (m + o_.batch_size - 1) / o_.batch_size;
  bad_budget_ = static_cast<int64_t>(o_.max_bad_fraction * static_cast<double>(m));
  next_ = std::min(o_.start_batch, num_batches_);
  keep_freed_heap();  // as in any moh command; here for library users (tests, benches) too
  const int workers = std::max(1, o_.workers);
  for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

StreamLoader::~StreamLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

// A batch tensor of these sizes: one from the pool that only the pool refers to (no tensor or view of its storage
// elsewhere: the consumer has let go of it), else a new one, kept in the pool while it holds fewer than a batch per
// worker plus the prefetch plus the consumer's two. Batches of 128 images are 77 MB: reusing them saves ~19k page
// faults each.
at::Tensor StreamLoader::batch_tensor(at::IntArrayRef sizes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const at::Tensor& t : pool_)
    if (t.use_count() == 1 && t.storage().use_count() == 1 && t.sizes() == sizes) return t;
  at::Tensor t = at::empty(sizes, at::kFloat);
  if (static_cast<int>(pool_.size()) < std::max(1, o_.workers) + o_.prefetch + 2) pool_.push_back(t);
  return t;
}

std::pair<at::Tensor, at::Tensor> StreamLoader::build(int64_t batch) {
  const auto m = static_cast<int64_t>(order_.size());
  const int64_t begin = batch * o_.batch_size, end = std::min(begin + o_.batch_size, m);
  at::Tensor x;  // (B, C, S, S): each sample is transformed straight into its row
  at::Tensor y = at::empty({end - begin}, at::kLong);
  int64_t* labels = y.data_ptr<int64_t>();
  for (int64_t p = begin; p < end; ++p) {
    // The sample's global position in the epoch: seeds its augmentation identically on any world size.
    const int64_t global = static_cast<int64_t>(o_.rank) + static_cast<int64_t>(o_.world) * p;
    AugRng rng(mix_seed(mix_seed(o_.seed, static_cast<uint64_t>(o_.epoch)), static_cast<uint64_t>(global)));
    at::Tensor img;
    int64_t file = order_[static_cast<size_t>(p)];
    for (int64_t attempt = 0; attempt < 16 && !img.defined(); ++attempt) {
      file = order_[static_cast<size_t>((p + attempt) % m)];
      const std::string& path = index_.files[static_cast<size_t>(file)];
      DecodedImage d = read_image(path, o_.channels);
      img = d.pixels;
      if (d.ok()) continue;
      const int64_t bad = ++bad_;
      std::string first;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (first_bad_.empty()) first_bad_ = path + ": " + d.problem;
        first = first_bad_;
      }
      if (bad > bad_budget_)
        throw UserError(
            "data.root " + o_.root,
            std::to_string(bad) + " unreadable images in an epoch of " + std::to_string(order_.size()) +
                " (first: " + first + ")",
            "above data.max_bad_fraction = " + std::to_string(o_.max_bad_fraction) + "; fix or remove them");
    }
    if (!img.defined())
      throw UserError("data.root", "16 unreadable images in a row near " + index_.files[static_cast<size_t>(file)],
                      "check the dataset tree");
    if (!x.defined()) x = batch_tensor({end - begin, img.size(2), tf_.size, tf_.size});
    if (o_.train)
      train_transform(img, tf_, rng, x[p - begin]);
    else
      eval_transform(img, tf_, x[p - begin]);
    labels[p - begin] = index_.labels[static_cast<size_t>(file)];
  }
  return {x, y};
}

void StreamLoader::work(int w) {
  const int64_t stride = std::max(1, o_.workers);  // worker w builds batches w, w + stride, ...
  for (int64_t b = o_.start_batch + w; b < num_batches_; b += stride) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || b < next_ + stride + o_.prefetch; });
      if (stop_ || error_) return;
    }
    std::pair<at::Tensor, at::Tensor> batch;
    try {
      batch = build(b);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ready_.emplace(b, std::move(batch));
    cv_.notify_all();
  }
}

bool StreamLoader::next(at::Tensor& x, at::Tensor& y) {
  std::unique_lock<std::mutex> lock(mu_);
  if (next_ >= num_batches_) {
    if (bad_ > 0 && !reported_)
      std::cerr << "warning: " << o_.root << ": " << bad_.load()
                << " unreadable image(s) replaced this epoch (first: " << first_bad_ << ")\n";
    reported_ = true;
    return false;
  }
  cv_.wait(lock, [&] { return ready_.count(next_) > 0 || error_ != nullptr; });
  if (!ready_.count(next_)) std::rethrow_exception(error_);
  auto node = ready_.extract(next_);
  std::tie(x, y) = std::move(node.mapped());
  ++next_;
  cv_.notify_all();
  return true;
}

}  // namespace moh::datasets
