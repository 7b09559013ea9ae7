#pragma once
// Activation checkpointing (torch.utils.checkpoint, reentrant variant): a function of tensors runs without keeping
// its intermediate activations; the backward pass runs it again from its saved inputs — with the random state and
// the autocast settings it first ran with — and backpropagates through the recomputed graph. Memory of a block
// stack then grows with its inputs, not its activations, for about one more forward pass of compute. Gradients equal
// a plain call's (bit for bit on deterministic kernels).
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace moh {

/// A function of tensors returning defined tensors (a block: (x, c) -> (x', aux_loss)).
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// fn(inputs) without stored activations when grad mode is on (else a plain call). `fn` must give the same outputs
/// when called again with the same inputs and random state, and must stay valid until the backward pass.
std::vector<at::Tensor> checkpointed(const TensorFn& fn, const std::vector<at::Tensor>& inputs);

/// True while a checkpointed function runs again in the backward pass: what must happen once per step (head-load
/// counts, statistics) skips it then.
bool recomputing();

}  // namespace moh
