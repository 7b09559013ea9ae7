#pragma once
// AdamW's step and global gradient-norm clipping over every parameter of a model, in three implementations that
// compute the same update (PyTorch's `foreach=` / `fused=` choice of torch.optim.AdamW):
//   for_loop  torch::optim::AdamW::step and torch::nn::utils::clip_grad_norm_, one small kernel per op per tensor
//             and a read of the norm back to the host (the reference);
//   foreach   the same ops, in the same order, as ATen's multi-tensor `_foreach_*` kernels: one launch covers many
//             tensors; the clip coefficient stays on the device (no host read);
//   fused     ATen's `_fused_adamw_` (LibTorch >= 2.0 on CUDA, >= 2.4 on the CPU): one pass over each parameter's
//             weights, gradient and moments; equal to for_loop within fp32 rounding (its bias corrections are
//             computed in fp32).
// The optimizer state stays in torch::optim::AdamW's own state map (exp_avg, exp_avg_sq, step), so checkpoints and
// exact resume do not depend on the implementation.
#include <torch/optim/adamw.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/platform/amp.h"
#include "core/train_config.h"

namespace moh {

/// Key of a parameter's entry in a LibTorch optimizer's state map: a string in LibTorch 1.x (what its
/// c10::guts::to_string(impl) writes), the TensorImpl pointer in 2.x.
template <class Map>
typename Map::key_type optimizer_state_key(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

/// Whether this LibTorch has `_fused_adamw_` for tensors on `device` (CUDA from 2.0, CPU from 2.4).
bool fused_adamw_available(const c10::Device& device);

/// The implementation a run on `device` uses: `automatic` is fused on CUDA where the build has it, else foreach
/// (on the CPU foreach runs the for_loop ops tensor by tensor, so CPU runs keep their results bit for bit).
/// A `fused` request the build cannot serve is a UserError naming optim.impl.
OptimImpl resolve_optim_impl(OptimImpl requested, const c10::Device& device);

/// One AdamW step (torch::optim::AdamW: p ← p·(1 − lr·wd); m, v moments; p ← p − lr/(1 − β1^t) · m / (√v/√(1 − β2^t)
/// + ε)) over every parameter that has a gradient, with each group's current options. `impl` is resolved (not
/// automatic). State is created on a parameter's first step as torch::optim::AdamW creates it. No AMSGrad.
/// `found_inf` (fused only; a 0-dim float on the device, 1 = skip): the step is skipped on the device, parameters and
/// moments untouched, without the host knowing; the host's step counts still advanced (adamw_unstep takes it back
/// once the host learns of it).
void adamw_step(torch::optim::AdamW& optimizer, OptimImpl impl, const at::Tensor& found_inf = {});

/// Takes back one step of the state counts of `params` (a step skipped on the device, learned of later).
void adamw_unstep(torch::optim::AdamW& optimizer, const std::vector<at::Tensor>& params);

/// Scales the gradients of `params` so that their global L2 norm is at most `max_norm` (torch.nn.utils.
/// clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6))). for_loop is LibTorch's clip_grad_norm_ (which
/// reads the norm back); foreach/fused keep the coefficient on the device. Returns the norm before clipping (0-dim,
/// on the gradients' device; undefined when no parameter has a gradient).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, OptimImpl impl);

/// Ends an optimizer step after the backward pass(es): unscales (fp16), clips the global gradient norm (clip > 0),
/// steps unless an fp16 overflow says skip, and zeroes the gradients, with AdamW and clipping in implementation
/// `impl` (resolved, core/train/optimizer.h). Returns whether the step was taken.
bool finish_optimizer_step(torch::optim::AdamW& optimizer, const std::vector<at::Tensor>& params, GradScaler& scaler,
                           double clip, OptimImpl impl);

}  // namespace moh
