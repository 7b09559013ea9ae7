#include "vision/nn/head_surgery.h"

#include <ATen/record_function.h>

#include <c10/core/GradMode.h>

#include <algorithm>

#include "core/error.h"

namespace moh::nn {

at::Tensor HeadHooks::apply(const at::Tensor& mixed, const at::Tensor& proj_weight, int64_t heads) {
  if (!record && !scale.defined()) return mixed;
  const int64_t B = mixed.size(0), N = mixed.size(1), inner = mixed.size(2), d = inner / heads;
  at::Tensor o = mixed.reshape({B * N, heads, d});  // (T, h, d)
  if (record) {
    // Head i's share of the projection: o_i W_O[:, i·d:(i+1)·d]ᵀ, (T, h, C); its L2 norm per token.
    const at::Tensor w = proj_weight.detach().view({proj_weight.size(0), heads, d});     // (C, h, d)
    const at::Tensor norms = at::einsum("thd,chd->thc", {o.detach(), w}).norm(2, {-1});  // (T, h)
    const at::Tensor sum = norms.sum(0).to(at::kCPU, at::kDouble);
    norm_sum = norm_sum.defined() ? norm_sum + sum : sum;
    tokens += B * N;
  }
  if (scale.defined()) o = o * scale.to(o.scalar_type()).view({1, heads, 1});
  return o.view({B, N, inner});
}

at::Tensor HeadHooks::mean_norms(int64_t heads) const {
  if (!norm_sum.defined() || tokens == 0) return at::zeros({heads}, at::kDouble);
  return norm_sum / static_cast<double>(tokens);
}

std::vector<std::pair<std::string, HeadControl*>> head_controls(torch::nn::Module& model) {
  std::vector<std::pair<std::string, HeadControl*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/true))
    if (auto* c = dynamic_cast<HeadControl*>(item.value().get())) out.emplace_back(item.key(), c);
  return out;
}

void HeadControl::count_training_picks(const at::Tensor& routed, int64_t pool, const at::Tensor& picks) {
  RECORD_USER_SCOPE("moh::router");
  c10::NoGradGuard ng;
  at::Tensor counts = picks;  // (pool)
  if (!counts.defined()) {
    // scatter_add, not bincount: CUDA's bincount reads the largest index back to size its output (a host sync per
    // layer and step).
    const at::Tensor flat = routed.reshape({-1});
    counts = at::zeros({pool}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
  }
  training_load = training_load.defined() ? training_load + counts : counts;
}

void set_plain_routers(torch::nn::Module& model, bool on) {
  for (const auto& named : head_controls(model)) named.second->set_plain_router(on);
}

void set_fused_attention(torch::nn::Module& model, FusedMode mode) {
  for (const auto& named : head_controls(model)) named.second->set_fused_ops(mode);
}

std::vector<at::Tensor> take_training_load(torch::nn::Module& model) {
  std::vector<at::Tensor> loads;
  for (const auto& named : head_controls(model)) {
    HeadControl* layer = named.second;
    if (layer->routed_topk() == 0) continue;
    const int64_t pool = layer->head_count() - layer->shared_count();
    loads.push_back(layer->training_load.defined() ? layer->training_load : at::zeros({pool}, at::kLong));
    layer->training_load = at::Tensor();
  }
  return loads;
}

void permute_heads(TensorMap& w, const HeadLayout& layer, const std::vector<int64_t>& perm) {
  const int64_t h = layer.heads;
  if (static_cast<int64_t>(perm.size()) != h) throw std::invalid_argument("permute_heads: permutation size");
  const at::Tensor index = at::tensor(perm, at::kLong);
  for (const HeadTensor& ht : layer.tensors) {
    auto it = w.find(layer.prefix + "." + ht.name);
    if (it == w.end()) continue;
    at::Tensor t = it->second;
    const int64_t axis = ht.axis, size = t.size(axis);
    if (size % (ht.groups * h) != 0)
      throw UserError("tensor '" + it->first + "'",
                      "dimension " + std::to_string(axis) + " of size " + std::to_string(size) + " does not hold " +
                          std::to_string(ht.groups) + " × " + std::to_string(h) + " heads",
                      "the weights do not match the model's head layout");
    std::vector<int64_t> shape = t.sizes().vec();
    std::vector<int64_t> split(shape.begin(), shape.begin() + axis);
    split.insert(split.end(), {ht.groups, h, size / (ht.groups * h)});
    split.insert(split.end(), shape.begin() + axis + 1, shape.end());
    it->second = t.reshape(split).index_select(axis + 1, index.to(t.device())).reshape(shape).contiguous();
  }
}

std::vector<int64_t> shared_first_permutation(int64_t heads, std::vector<int64_t> shared) {
  std::sort(shared.begin(), shared.end());
  std::vector<int64_t> perm = shared;
  for (int64_t i = 0; i < heads; ++i)
    if (!std::binary_search(shared.begin(), shared.end(), i)) perm.push_back(i);
  return perm;
}

}  // namespace moh::nn
