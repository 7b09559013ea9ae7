#include "vision/nn/norms.h"

#include <c10/util/Exception.h>
#include <torch/nn/init.h>

namespace moh::nn {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor f = x.to(at::kFloat);
  return (f * at::rsqrt(f.pow(2).mean(-1, true) + eps)).to(x.scalar_type()) * weight;
}

RopeTables rope2d_tables(int64_t head_dim, int64_t grid) {
  TORCH_CHECK(head_dim % 4 == 0 && grid > 0, "rope2d_tables: needs head_dim % 4 == 0, got ", head_dim);
  const int64_t half = head_dim / 2;  // channels per axis
  const at::Tensor theta = 1.0 / at::pow(10000.0, at::arange(0, half, 2, at::kFloat).narrow(0, 0, half / 2) / half);
  const at::Tensor pos = at::arange(grid, at::kFloat) / static_cast<double>(grid) * static_cast<double>(grid);
  const at::Tensor f = at::outer(pos, theta).repeat_interleave(2, 1);  // (G, half): θ_0, θ_0, θ_1, θ_1, …
  const at::Tensor rows = f.unsqueeze(1).expand({grid, grid, half}), cols = f.unsqueeze(0).expand({grid, grid, half});
  const at::Tensor angles = at::cat({rows, cols}, 2).reshape({grid * grid, head_dim});  // (N, d)
  return {angles.cos(), angles.sin()};
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope) {
  const auto shape = x.sizes().vec();
  std::vector<int64_t> pairs = shape;
  pairs.back() /= 2;
  pairs.push_back(2);
  const at::Tensor xp = x.reshape(pairs);                                                          // (..., d/2, 2)
  const at::Tensor rotated = at::stack({-xp.select(-1, 1), xp.select(-1, 0)}, -1).reshape(shape);  // (..., d)
  return x * rope.cos.to(x.scalar_type()) + rotated * rope.sin.to(x.scalar_type());
}

}  // namespace moh::nn
