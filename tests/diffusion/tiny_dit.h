#pragma once
// A small DiT for sampler tests: DiT-Pixel/4 (or MoH-DiT-Pixel/4-75: 4 shared + top-2 of 4 routed heads) on 8 px
// inputs with 2 layers, every parameter perturbed so that the output is not adaLN-Zero's 0.
#include <torch/torch.h>

#include "diffusion/dit.h"

namespace moh::diffusion {

inline DiT tiny_dit(int64_t channels, bool moh) {
  DiTOptions o = dit_options(moh ? "MoH-DiT-Pixel/4-75" : "DiT-Pixel/4");
  o.input_size = 8;
  o.in_channels = channels;
  o.depth = 2;
  if (moh) {
    o.heads = {{8, 2}};
    o.shared = {{4, 2}};
    o.topk = {{2, 2}};
  }
  torch::manual_seed(0);
  DiT m(o);
  // adaLN-Zero makes the output 0 at init; perturb every parameter so the tests see a non-trivial network.
  torch::NoGradGuard ng;
  for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.05);
  m->eval();
  return m;
}

}  // namespace moh::diffusion
