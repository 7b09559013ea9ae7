#pragma once
// The kernels behind torch.ops.moh (python/): argument checks that name the argument and the expected value (a
// Python ValueError / TypeError, never a crash), and one registration function per group of ops, called for each
// dispatch key the build serves (CPU always; CUDA in builds with the toolkit's CUDA kernels, MOH_CUDA_KERNELS).
// Schemas: registration.cpp. The arithmetic is the toolkit's (vision/nn/fused_ops.h, vision/nn/head_mix.h,
// eval/): these files only check, convert and call.
#include <ATen/ATen.h>
#include <ATen/DeviceGuard.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace moh::torch_ops {

/// "[2, 3, 4]" for an error message.
std::string shape_str(at::IntArrayRef sizes);

/// t has `dims` dimensions, else a ValueError "moh::OP: NAME must be SHAPE, got [..]".
void check_dims(const char* op, const char* name, const at::Tensor& t, int64_t dims, const char* shape);
/// t's sizes equal `want`, else a ValueError naming both.
void check_sizes(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef want, const char* shape);
/// t is fp32, bf16 or fp16 (what the fused loops take), else a TypeError.
void check_fused_type(const char* op, const char* name, const at::Tensor& t);
/// t is on `device`, else a ValueError.
void check_device(const char* op, const char* name, const at::Tensor& t, const c10::Device& device);
/// t has type `type`, else a TypeError.
void check_type(const char* op, const char* name, const at::Tensor& t, at::ScalarType type);
/// t (int64) holds indices in [0, bound): a ValueError on a CPU; on CUDA an asynchronous device-side assert (no
/// host synchronisation, as PyTorch's own index ops).
void check_index_range(const char* op, const char* name, const at::Tensor& t, int64_t bound);

/// Kernels launch on the device of their first tensor argument, whatever the current device (PyTorch's generated
/// operators do the same): declare one at the top of every op that may run on CUDA.
using DeviceOf = at::OptionalDeviceGuard;

/// Registration of each group on one dispatch key (`m` of a TORCH_LIBRARY_IMPL block).
void impl_block_ops(torch::Library& m);
void impl_attention_ops(torch::Library& m);

}  // namespace moh::torch_ops
