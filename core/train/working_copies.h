#pragma once
// Low-precision working copies of a model's weights for mixed-precision training: under autocast every product casts
// its fp32 master weight to bf16 / fp16 in every forward pass (one copy kernel per weight per step, each again when
// activation checkpointing recomputes a block). A WorkingCopies keeps those casts, made once per optimizer step in
// one multi-tensor copy (refresh()); the products read them (working_weight) through an autograd step whose backward
// casts the gradient back to the master's type, as autocast's cast does. Values and gradients are those of autocast's
// casts bit for bit; master weights, optimizer state and checkpoints stay fp32.
#include <ATen/ATen.h>

#include <memory>
#include <unordered_map>
#include <vector>

namespace moh {

/// The working copies of `params` in `dtype` (bf16 or fp16).
class WorkingCopies {
 public:
  WorkingCopies(const std::vector<at::Tensor>& params, at::ScalarType dtype);
  /// Casts every master weight into its copy (one multi-tensor copy where LibTorch has _foreach_copy_): after each
  /// optimizer step, and after weights were loaded.
  void refresh();
  /// The copy of master weight `p` as a differentiable function of p, or undefined when p has no copy or changed
  /// since the last refresh (its version counter moved).
  at::Tensor get(const at::Tensor& p) const;
  at::ScalarType dtype() const { return dtype_; }

 private:
  struct Entry {
    at::Tensor master, copy;
    int64_t version = -1;
  };
  std::unordered_map<const void*, Entry> entries_;  // by the master's TensorImpl
  std::vector<at::Tensor> masters_, copies_;
  at::ScalarType dtype_;
};

/// Makes `copies` the working copies products read (working_weight) for the lifetime of the scope; a null pointer
/// turns them off. One per process: the training step of the one model being trained.
class WorkingCopyScope {
 public:
  explicit WorkingCopyScope(const WorkingCopies* copies);
  ~WorkingCopyScope();
  WorkingCopyScope(const WorkingCopyScope&) = delete;
  WorkingCopyScope& operator=(const WorkingCopyScope&) = delete;

 private:
  const WorkingCopies* prev_;
};

/// What a product reads for weight `w`: its working copy while a WorkingCopyScope holds one for it and autocast is on
/// for w's device in the copy's type, else w itself.
at::Tensor working_weight(const at::Tensor& w);

}  // namespace moh
