#pragma once
// The random generators' states as tensors: what a checkpoint saves and every rank restores (core/train/checkpoint.h,
// core/dist/distributed.h), below both so that neither depends on the other for it.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace moh {

/// The CPU random generator state as a tensor (uint8), and its inverse.
at::Tensor cpu_rng_state();
void set_cpu_rng_state(const at::Tensor& state);
/// The default generator of a CUDA device: its state (uint8), the inverse, and a fresh seed (a run on a GPU saves
/// and restores it beside the CPU's, so the draws made on the device are not replayed after a resume).
at::Tensor device_rng_state(const c10::Device& device);
void set_device_rng_state(const c10::Device& device, const at::Tensor& state);
void seed_device_rng(const c10::Device& device, uint64_t seed);

}  // namespace moh
