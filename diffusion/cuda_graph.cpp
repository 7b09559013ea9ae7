#include "diffusion/cuda_graph.h"

#include <iostream>

#include "vision/nn/head_surgery.h"
#include "vision/nn/moh_attention.h"

#ifdef MOH_TORCH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace moh::diffusion {

bool cuda_graphs_built() {
#ifdef MOH_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

struct GraphedForward::Entry {
#ifdef MOH_TORCH_CUDA
  at::cuda::CUDAGraph graph;
#endif
  at::Tensor x, t, y, out;  // the graph's inputs and output, at fixed addresses
};

GraphedForward::GraphedForward(DiT& model, bool enabled) : model_(&model), enabled_(enabled && cuda_graphs_built()) {
  for (auto& [name, layer] : nn::head_controls(*model))
    if (auto* a = dynamic_cast<nn::MoHAttentionImpl*>(layer); a && a->routed_topk() > 0) routed_.push_back(a);
}

GraphedForward::~GraphedForward() = default;

GraphedForward::Key GraphedForward::key_of(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) const {
  std::vector<int64_t> budget;
  for (const nn::MoHAttentionImpl* a : routed_) budget.push_back(a->router.shared_only ? 0 : a->router.topk);
  bool autocast = false;
  int autocast_dtype = 0;
#ifdef MOH_TORCH_CUDA
  autocast = at::autocast::is_autocast_enabled(at::kCUDA);
  autocast_dtype = static_cast<int>(at::autocast::get_autocast_dtype(at::kCUDA));
#endif
  return {x.sizes().vec(), static_cast<int>(x.scalar_type()), static_cast<int>(t.scalar_type()),
          y.size(0),       autocast ? 1 + autocast_dtype : 0, budget};
}

// The output in fp32 whatever autocast computed it in: guidance and the solvers' arithmetic stay fp32.
at::Tensor GraphedForward::operator()(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
  const auto fp32 = [](const at::Tensor& out) { return out.scalar_type() == at::kFloat ? out : out.to(at::kFloat); };
  if (!enabled_ || !fallback_.empty() || !x.is_cuda()) return fp32((*model_)->forward(x, t, y).out);
  const Key key = key_of(x, t, y);
  auto it = graphs_.find(key);
  Entry* e = it != graphs_.end() ? it->second.get() : capture(x, t, y);
  if (!e) return fp32((*model_)->forward(x, t, y).out);
#ifdef MOH_TORCH_CUDA
  e->x.copy_(x), e->t.copy_(t), e->y.copy_(y);
  e->graph.replay();
  ++replays_;
  // a copy: a solver keeps earlier outputs (Heun's first slope) while the graph runs again
  return e->out.scalar_type() == at::kFloat ? e->out.clone() : e->out.to(at::kFloat);
#else
  return {};
#endif
}

// Warm-up on a side stream (cuBLAS handles, workspaces, lazy initialisation), then one capture, as
// torch.cuda.make_graphed_callables does; the autocast cast cache is off meanwhile so that the graph casts the weights
// itself instead of reading a cache entry freed when the autocast scope ends. A capture that fails (a host read
// inside the forward) leaves graphs off for this sampler, with one line on stderr.
GraphedForward::Entry* GraphedForward::capture(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
#ifdef MOH_TORCH_CUDA
  auto e = std::make_unique<Entry>();
  e->x = x.clone(), e->t = t.clone(), e->y = y.clone();
  const bool cache = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  c10::cuda::device_synchronize();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, x.device().index());
  try {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 2; ++i) (void)(*model_)->forward(e->x, e->t, e->y);
    side.synchronize();
    e->graph.capture_begin();
    try {
      e->out = (*model_)->forward(e->x, e->t, e->y).out;
    } catch (...) {
      try {
        e->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    e->graph.capture_end();
    side.synchronize();
  } catch (const std::exception& err) {
    at::autocast::set_autocast_cache_enabled(cache);
    (void)cudaGetLastError();  // the failed capture's error is not the next kernel's
    const std::string what = err.what();
    fallback_ = what.substr(0, what.find('\n'));
    std::cerr << "note: sampling without CUDA graphs (the forward cannot be captured: " << fallback_ << ")\n";
    return nullptr;
  }
  at::autocast::set_autocast_cache_enabled(cache);
  Entry* raw = e.get();
  graphs_[key_of(x, t, y)] = std::move(e);
  return raw;
#else
  (void)x, (void)t, (void)y;
  return nullptr;
#endif
}

}  // namespace moh::diffusion
