#pragma once
// The network evaluations of a sampling chain replayed as CUDA graphs (sampling.cuda_graph: auto). A reverse chain
// calls the same DiT forward hundreds of times on tensors of the same shapes; launched one kernel at a time from the
// host, a small or medium model leaves the GPU idle between kernels. A captured graph launches the whole forward at
// once. Graphs are captured on first use per input shape, dtype, autocast setting and MoH head budget, and reused
// across the batches of a run; inputs are copied into the graph's own tensors and its output copied out, so the
// sampler sees exactly what an eager forward returns (the same kernels run; outputs equal in deterministic mode).
// Where no graph can serve — CPU tensors, a LibTorch without CUDA, a forward that reads a value back to the host
// (the sparse MoH path plans its buckets on the host) — the forward runs eagerly.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "diffusion/dit.h"

namespace moh::nn {
struct MoHAttentionImpl;
}

namespace moh::diffusion {

/// Whether this build can capture CUDA graphs (a CUDA LibTorch).
bool cuda_graphs_built();

/// model->forward(x, t, y).out in fp32 (an autocast forward's output cast), replayed from CUDA graphs where it can be.
class GraphedForward {
 public:
  /// `enabled` false: always eager (sampling.cuda_graph: off).
  GraphedForward(DiT& model, bool enabled);
  ~GraphedForward();
  GraphedForward(const GraphedForward&) = delete;
  GraphedForward& operator=(const GraphedForward&) = delete;

  at::Tensor operator()(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y);
  /// Forward passes served by a graph so far, and graphs captured.
  int64_t replays() const { return replays_; }
  int64_t graphs() const { return static_cast<int64_t>(graphs_.size()); }
  /// Why graphs were given up ("" while they work or were never tried).
  const std::string& fallback_reason() const { return fallback_; }

 private:
  struct Entry;
  using Key = std::tuple<std::vector<int64_t>, int, int, int64_t, int, std::vector<int64_t>>;
  Key key_of(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) const;
  Entry* capture(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y);

  DiT* model_;
  bool enabled_;
  std::vector<nn::MoHAttentionImpl*> routed_;  // the layers whose head budget keys a graph
  std::map<Key, std::unique_ptr<Entry>> graphs_;
  int64_t replays_ = 0;
  std::string fallback_;
};

}  // namespace moh::diffusion
