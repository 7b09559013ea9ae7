#include "diffusion/sample_set.h"

#include <torch/utils.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "core/io/atomic_io.h"
#include "core/platform/amp.h"
#include "datasets/loader.h"
#include "datasets/npz.h"

namespace moh::diffusion {

namespace fs = std::filesystem;

std::string sample_part_path(const std::string& parts_dir, int64_t batch) {
  char name[32];
  std::snprintf(name, sizeof name, "/batch_%06lld.npy", static_cast<long long>(batch));
  return parts_dir + name;
}

std::vector<int64_t> missing_sample_batches(int64_t n, const std::string& parts_dir, int64_t batch_size) {
  const int64_t num_batches = (n + batch_size - 1) / batch_size;
  std::vector<int64_t> out;
  for (int64_t k = 0; k < num_batches; ++k)
    if (!fs::exists(sample_part_path(parts_dir, k))) out.push_back(k);
  return out;
}

std::vector<int64_t> rank_share(const std::vector<int64_t>& batches, const dist::Group& group) {
  std::vector<int64_t> out;
  for (size_t i = static_cast<size_t>(group.rank()); i < batches.size(); i += static_cast<size_t>(group.world()))
    out.push_back(batches[i]);
  return out;
}

int64_t sample_parts(DiT& model, const GaussianDiffusion& chain, AutoencoderKL& vae, const at::Tensor& labels,
                     const std::vector<int64_t>& batches, const SampleSetOptions& o, const RunContext& ctx,
                     const std::string& parts_dir, const std::function<void()>& on_step) {
  const DiTOptions& mo = model->options;
  const int64_t n = labels.size(0);
  fs::create_directories(parts_dir);
  const Tf32Scope tf32(ctx.precision);                  // sampling.precision: tf32 (DiT's sample.py), VAE included
  GraphedForward graphs(model, o.sampling.cuda_graph);  // captured once, replayed over every batch
  int64_t nfe = 0;
  for (const int64_t k : batches) {
    const int64_t i = k * o.batch_size, b = std::min(o.batch_size, n - i);
    torch::manual_seed(datasets::mix_seed(o.seed, static_cast<uint64_t>(k)));
    const at::Tensor noise = at::randn({b, mo.in_channels, mo.input_size, mo.input_size}).to(ctx.device);
    at::Tensor x;
    {
      const AutocastScope autocast(ctx);  // bf16 / fp16: the network only; the chain's state stays fp32
      x = sample_loop(
          model, chain, noise, labels.narrow(0, i, b).to(ctx.device), o.sampling,
          [&] {
            if (on_step) on_step();
          },
          &nfe, &graphs);  // (b, C, I, I)
    }
    if (vae) {
      torch::NoGradGuard ng;
      x = vae->decode(vae->latents.to_vae(x));  // (b, 3, f·I, f·I) in ~[−1, 1]
    }
    write_file_atomic(sample_part_path(parts_dir, k), datasets::npy_bytes(to_uint8_nhwc(x).cpu()));  // (b, H, W, C)
  }
  return nfe;
}

void merge_sample_parts(const std::string& parts_dir, const at::Tensor& labels, int64_t batch_size,
                        const std::string& out_npz, const std::function<void(int64_t, const at::Tensor&)>& on_batch) {
  const int64_t n = labels.size(0), num_batches = (n + batch_size - 1) / batch_size;
  datasets::NpzWriter npz(out_npz);
  for (int64_t k = 0; k < num_batches; ++k) {
    const std::string path = sample_part_path(parts_dir, k);
    if (!fs::exists(path)) throw std::runtime_error("sample merge: " + path + " is missing (a rank did not finish)");
    at::Tensor images = datasets::parse_npy(read_file(path, "sample part"), path);  // (b, H, W, C)
    const int64_t b = std::min(batch_size, n - k * batch_size);
    if (images.dim() != 4 || images.size(0) != b || images.scalar_type() != at::kByte ||
        (images.size(3) != 1 && images.size(3) != 3))
      throw std::runtime_error("sample merge: " + path + " is not (" + std::to_string(b) + ", H, W, 1|3) uint8");
    if (images.size(3) == 1) images = images.expand({-1, -1, -1, 3}).contiguous();  // ADM batches are RGB
    if (k == 0) npz.begin("arr_0", at::kByte, {n, images.size(1), images.size(2), 3});
    npz.write_rows(images);
    if (on_batch) on_batch(k * batch_size, images);
  }
  npz.end();
  npz.begin("arr_1", at::kLong, {n});
  npz.write_rows(labels.to(at::kCPU, at::kLong));
  npz.end();
  npz.close();
}

}  // namespace moh::diffusion
