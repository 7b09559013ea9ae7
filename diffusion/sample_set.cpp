#include "diffusion/sample_set.h"

#include <torch/utils.h>

#include <map>
#include <stdexcept>

#include "datasets/loader.h"

namespace moh::diffusion {

int64_t sample_images_steps(int64_t n, const SampleSetOptions& o, const GaussianDiffusion& chain, const dist::Group& group) {
  const int64_t num_batches = (n + o.batch_size - 1) / o.batch_size;
  return ((num_batches - group.rank() + group.world() - 1) / group.world()) * chain.num_steps();
}

at::Tensor sample_images(DiT& model, const GaussianDiffusion& chain, AutoencoderKL& vae, const at::Tensor& labels,
                         const SampleSetOptions& o, const RunContext& ctx, dist::Group& group,
                         const std::function<void()>& on_step) {
  const DiTOptions& mo = model->options;
  const int64_t n = labels.size(0), num_batches = (n + o.batch_size - 1) / o.batch_size;
  std::map<int64_t, at::Tensor> mine;
  for (int64_t k = group.rank(); k < num_batches; k += group.world()) {
    const int64_t i = k * o.batch_size, b = std::min(o.batch_size, n - i);
    torch::manual_seed(datasets::mix_seed(o.seed, static_cast<uint64_t>(k)));
    const at::Tensor noise = at::randn({b, mo.in_channels, mo.input_size, mo.input_size}).to(ctx.device);
    at::Tensor x = sample_loop(model, chain, noise, labels.narrow(0, i, b), o.chain, [&] {
      if (on_step) on_step();
    });  // (b, C, I, I)
    if (vae) {
      torch::NoGradGuard ng;
      x = vae->decode(x / kSdVaeLatentScale);  // (b, 3, 8·I, 8·I) in ~[−1, 1]
    }
    mine[k] = to_uint8_nhwc(x).cpu();  // (b, H, W, C)
  }
  if (group.world() == 1) {
    std::vector<at::Tensor> all;
    for (auto& [k, t] : mine) all.push_back(t);
    return at::cat(all);
  }
  std::vector<at::Tensor> images;
  const int64_t side = mo.input_size * (vae ? 8 : 1), channels = vae ? 3 : mo.in_channels;
  for (int64_t k = 0; k < num_batches; ++k) {
    const int64_t b = std::min(o.batch_size, n - k * o.batch_size);
    const at::Tensor empty = at::empty({0, side, side, channels}, at::kByte);
    images.push_back(group.gather_cat(mine.count(k) ? mine.at(k) : empty));  // only the owner contributes rows
    if (images.back().size(0) != b) throw std::runtime_error("sample gather: batch " + std::to_string(k) + " incomplete");
  }
  return at::cat(images);
}

}  // namespace moh::diffusion
