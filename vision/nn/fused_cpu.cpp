// The fused block operations' loops on the CPU (declarations and layouts: fused_kernels.h). Rows are split over
// LibTorch's intra-op threads; every reduction over tokens goes through fixed tiles of kTileRows rows, so the result
// does not depend on the thread count.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "vision/nn/fused_kernels.h"
#include "vision/nn/fused_rows.h"
#include "vision/nn/gelu_cpu.h"

namespace moh::nn::fused {

template <>
struct Storage<c10::BFloat16> {
  static float load(c10::BFloat16 v) { return static_cast<float>(v); }
  static c10::BFloat16 store(float v) { return c10::BFloat16(v); }  // round to nearest even
};
template <>
struct Storage<c10::Half> {
  static float load(c10::Half v) { return static_cast<float>(v); }
  static c10::Half store(float v) { return c10::Half(v); }
};

namespace cpu {
namespace {

// Calls f with a value of the element type `t` stands for.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(c10::BFloat16{});
    case DType::f16:
      return f(c10::Half{});
  }
}

template <class T>
float ld(const void* p, int64_t i) {
  return Storage<T>::load(static_cast<const T*>(p)[i]);
}
template <class T>
void st(void* p, int64_t i, float v) {
  static_cast<T*>(p)[i] = Storage<T>::store(v);
}

// The storage the vector row loops (fused_rows.h) take for T: fp32 as itself, bf16 as its bits; none (void) for fp16.
template <class T>
using RowBits = std::conditional_t<std::is_same_v<T, float>, float,
                                   std::conditional_t<std::is_same_v<T, c10::BFloat16>, uint16_t, void>>;
template <class T>
RowBits<T>* bits(void* p) {
  return static_cast<RowBits<T>*>(p);
}
template <class T>
const RowBits<T>* bits(const void* p) {
  return static_cast<const RowBits<T>*>(p);
}

// Runs fn(b, n0, n1, tile) for every tile of kTileRows rows of each of B row blocks of N rows, in parallel; tile is
// the tile's index in (B, tiles(N)) order, where its partial sums go.
template <class F>
void for_tiles(int64_t B, int64_t N, const F& fn) {
  const int64_t per = tiles(N);
  at::parallel_for(0, B * per, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / per, n0 = (t % per) * kTileRows;
      fn(b, n0, std::min(N, n0 + kTileRows), t);
    }
  });
}

// The factors rnd(1 + scale) of batch row b (D values).
template <class Tm>
void factors(Rows scale, int64_t b, int64_t D, float* out) {
  for (int64_t c = 0; c < D; ++c) out[c] = modulation_factor<Tm>(ld<Tm>(scale.p, b * scale.stride + c));
}

}  // namespace

void ln_modulate_forward(const void* x, DType tx, Rows shift, Rows scale, void* out, DType to, float* mean, float* rstd,
                         int64_t B, int64_t N, int64_t D, float eps) {
  with_type(tx, [&](auto xt) {
    with_type(shift.type, [&](auto mt) {
      with_type(to, [&](auto ot) {
        using Tx = decltype(xt);
        using Tm = decltype(mt);
        using To = decltype(ot);
        for_tiles(B, N, [&](int64_t b, int64_t n0, int64_t n1, int64_t) {
          std::vector<float> fac(static_cast<size_t>(D)), sh(static_cast<size_t>(D));
          factors<Tm>(scale, b, D, fac.data());
          for (int64_t c = 0; c < D; ++c) sh[c] = ld<Tm>(shift.p, b * shift.stride + c);
          if constexpr (std::is_same_v<Tx, float> && !std::is_void_v<RowBits<To>>) {
            const int64_t r0 = b * N + n0;
            return rows::ln_modulate_forward(static_cast<const float*>(x) + r0 * D, n1 - n0, D, sh.data(), fac.data(),
                                             eps, bits<To>(out) + r0 * D, mean + r0, rstd + r0);
          }
          for (int64_t n = n0; n < n1; ++n) {
            const int64_t r = b * N + n, base = r * D;
            float s = 0.f;
            for (int64_t c = 0; c < D; ++c) s += ld<Tx>(x, base + c);
            const float mu = s / static_cast<float>(D);
            float v = 0.f;
            for (int64_t c = 0; c < D; ++c) {
              const float dev = ld<Tx>(x, base + c) - mu;
              v += dev * dev;
            }
            const float rs = inv_std(v / static_cast<float>(D), eps);
            mean[r] = mu, rstd[r] = rs;
            for (int64_t c = 0; c < D; ++c)
              st<To>(out, base + c, modulate((ld<Tx>(x, base + c) - mu) * rs, sh[c], fac[c]));
          }
        });
      });
    });
  });
}

void ln_modulate_backward(const void* dy, DType tdy, const void* x, DType tx, Rows scale, const float* mean,
                          const float* rstd, void* dx, float* dshift_part, float* dscale_part, int64_t B, int64_t N,
                          int64_t D) {
  with_type(tx, [&](auto xt) {
    with_type(scale.type, [&](auto mt) {
      with_type(tdy, [&](auto yt) {
        using Tx = decltype(xt);
        using Tm = decltype(mt);
        using Ty = decltype(yt);
        for_tiles(B, N, [&](int64_t b, int64_t n0, int64_t n1, int64_t tile) {
          std::vector<float> fac(static_cast<size_t>(D)), g(static_cast<size_t>(D));
          factors<Tm>(scale, b, D, fac.data());
          float* dsh = dshift_part + tile * D;
          float* dsc = dscale_part + tile * D;
          std::fill(dsh, dsh + D, 0.f), std::fill(dsc, dsc + D, 0.f);
          if constexpr (std::is_same_v<Tx, float> && !std::is_void_v<RowBits<Ty>>) {
            const int64_t r0 = b * N + n0;
            return rows::ln_modulate_backward(bits<Ty>(dy) + r0 * D, static_cast<const float*>(x) + r0 * D, n1 - n0, D,
                                              fac.data(), mean + r0, rstd + r0, static_cast<float*>(dx) + r0 * D, dsh,
                                              dsc);
          }
          for (int64_t n = n0; n < n1; ++n) {
            const int64_t r = b * N + n, base = r * D;
            const float mu = mean[r], rs = rstd[r];
            float sg = 0.f, sgx = 0.f;
            for (int64_t c = 0; c < D; ++c) {
              const float d = ld<Ty>(dy, base + c), xh = (ld<Tx>(x, base + c) - mu) * rs;
              g[c] = modulate_grad(d, fac[c]);
              sg += g[c], sgx += g[c] * xh;
              dsh[c] += d, dsc[c] += d * xh;
            }
            const float mg = sg / static_cast<float>(D), mgx = sgx / static_cast<float>(D);
            for (int64_t c = 0; c < D; ++c)
              st<Tx>(dx, base + c, layer_norm_grad(g[c], (ld<Tx>(x, base + c) - mu) * rs, mg, mgx, rs));
          }
        });
      });
    });
  });
}

void gate_residual_forward(const void* x, DType tx, Rows gate, const void* branch, DType tb, void* out, int64_t B,
                           int64_t N, int64_t D) {
  with_type(tx, [&](auto xt) {
    with_type(tb, [&](auto bt) {
      using Tx = decltype(xt);
      using Tb = decltype(bt);
      at::parallel_for(0, B * N, 16, [&](int64_t begin, int64_t end) {
        if constexpr (std::is_same_v<Tx, float> && !std::is_void_v<RowBits<Tb>>) {
          for (int64_t r = begin; r < end;) {  // the rows of one batch element at a time (one gate row)
            const int64_t b = r / N, stop = std::min(end, (b + 1) * N);
            rows::gate_residual_forward(static_cast<const float*>(x) + r * D, bits<Tb>(gate.p) + b * gate.stride,
                                        bits<Tb>(branch) + r * D, static_cast<float*>(out) + r * D, stop - r, D);
            r = stop;
          }
          return;
        }
        for (int64_t r = begin; r < end; ++r) {
          const int64_t b = r / N, base = r * D, gb = b * gate.stride;
          for (int64_t c = 0; c < D; ++c)
            st<Tx>(out, base + c,
                   gate_residual<Tb>(ld<Tx>(x, base + c), ld<Tb>(gate.p, gb + c), ld<Tb>(branch, base + c)));
        }
      });
    });
  });
}

void gate_residual_backward(const void* dout, DType tx, Rows gate, const void* branch, DType tb, void* dbranch,
                            float* dgate_part, int64_t B, int64_t N, int64_t D) {
  with_type(tx, [&](auto xt) {
    with_type(tb, [&](auto bt) {
      using Tx = decltype(xt);
      using Tb = decltype(bt);
      for_tiles(B, N, [&](int64_t b, int64_t n0, int64_t n1, int64_t tile) {
        float* dg = dgate_part + tile * D;
        std::fill(dg, dg + D, 0.f);
        if constexpr (std::is_same_v<Tx, float> && !std::is_void_v<RowBits<Tb>>) {
          const int64_t r0 = b * N + n0;
          return rows::gate_residual_backward(static_cast<const float*>(dout) + r0 * D,
                                              bits<Tb>(gate.p) + b * gate.stride, bits<Tb>(branch) + r0 * D,
                                              bits<Tb>(dbranch) + r0 * D, dg, n1 - n0, D);
        }
        for (int64_t n = n0; n < n1; ++n) {
          const int64_t base = (b * N + n) * D;
          for (int64_t c = 0; c < D; ++c) {
            const float d = rnd<Tb>(ld<Tx>(dout, base + c));  // the product's gradient, in its type
            st<Tb>(dbranch, base + c, d * ld<Tb>(gate.p, b * gate.stride + c));
            dg[c] += rnd<Tb>(d * ld<Tb>(branch, base + c));
          }
        }
      });
    });
  });
}

namespace {

// The bias rounded to z's type (as autocast casts the Linear's bias), in fp32: F values.
template <class Tz>
std::vector<float> rounded_bias(const void* bias, DType tbias, int64_t F) {
  std::vector<float> b(static_cast<size_t>(F));
  with_type(tbias, [&](auto bt) {
    for (int64_t f = 0; f < F; ++f) b[f] = rnd<Tz>(ld<decltype(bt)>(bias, f));
  });
  return b;
}

// The element type of gelu_kernels' rows standing for Tz: fp32 as itself, bf16 as its bits, none for fp16 (void).
template <class Tz>
using GeluRow = std::conditional_t<std::is_same_v<Tz, float>, float,
                                   std::conditional_t<std::is_same_v<Tz, c10::BFloat16>, uint16_t, void>>;

}  // namespace

void bias_gelu_forward(const void* z, DType tz, const void* bias, DType tbias, void* out, int64_t T, int64_t F) {
  with_type(tz, [&](auto zt) {
    using Tz = decltype(zt);
    using R = GeluRow<Tz>;
    const std::vector<float> b = rounded_bias<Tz>(bias, tbias, F);
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if constexpr (!std::is_void_v<R>) {
          gelu_kernels::bias_forward(static_cast<const R*>(z) + t * F, b.data(), static_cast<R*>(out) + t * F, F);
        } else {
          for (int64_t f = 0; f < F; ++f) st<Tz>(out, t * F + f, gelu_tanh(biased<Tz>(ld<Tz>(z, t * F + f), b[f])));
        }
      }
    });
  });
}

void bias_gelu_backward(const void* dy, const void* z, DType tz, const void* bias, DType tbias, void* dz,
                        float* dbias_part, int64_t T, int64_t F) {
  with_type(tz, [&](auto zt) {
    using Tz = decltype(zt);
    using R = GeluRow<Tz>;
    const std::vector<float> b = rounded_bias<Tz>(bias, tbias, F);
    for_tiles(1, T, [&](int64_t, int64_t t0, int64_t t1, int64_t tile) {
      float* db = dbias_part + tile * F;
      std::fill(db, db + F, 0.f);
      for (int64_t t = t0; t < t1; ++t) {
        if constexpr (!std::is_void_v<R>) {
          const int64_t o = t * F;
          gelu_kernels::bias_backward(static_cast<const R*>(dy) + o, static_cast<const R*>(z) + o, b.data(),
                                      static_cast<R*>(dz) + o, db, F);
        } else {
          for (int64_t f = 0; f < F; ++f) {
            const float g = rnd<Tz>(ld<Tz>(dy, t * F + f) * gelu_tanh_grad(biased<Tz>(ld<Tz>(z, t * F + f), b[f])));
            st<Tz>(dz, t * F + f, g);
            db[f] += g;
          }
        }
      }
    });
  });
}

void route_forward(const void* logits, DType tl, int64_t T, RouterShape s, float* gates, int64_t* routed, float* p_part,
                   int64_t* picks_part) {
  with_type(tl, [&](auto lt) {
    using Tl = decltype(lt);
    const int L = s.logits(), E = s.experts, K = s.topk, h = s.heads();
    for_tiles(1, T, [&](int64_t, int64_t t0, int64_t t1, int64_t tile) {
      float row[kMaxRouterLogits], p[kMaxRouterLogits];
      int idx[kMaxRouterTopK];
      if (p_part) std::fill(p_part + tile * E, p_part + (tile + 1) * E, 0.f);
      if (picks_part) std::fill(picks_part + tile * E, picks_part + (tile + 1) * E, int64_t{0});
      for (int64_t t = t0; t < t1; ++t) {
        for (int j = 0; j < L; ++j) row[j] = ld<Tl>(logits, t * L + j);
        route_row(row, s, p, idx, gates + t * h);
        for (int k = 0; k < K; ++k) routed[t * K + k] = idx[k];
        if (p_part)
          for (int i = 0; i < E; ++i) p_part[tile * E + i] += p[i];
        if (picks_part)
          for (int k = 0; k < K; ++k) ++picks_part[tile * E + idx[k]];
      }
    });
  });
}

void route_backward(const void* logits, DType tl, int64_t T, RouterShape s, const int64_t* routed, const float* dgates,
                    const float* picks_coef, void* dlogits) {
  with_type(tl, [&](auto lt) {
    using Tl = decltype(lt);
    const int L = s.logits(), K = s.topk, h = s.heads();
    at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
      float row[kMaxRouterLogits], g[kMaxRouterLogits];
      int idx[kMaxRouterTopK];
      for (int64_t t = begin; t < end; ++t) {
        for (int j = 0; j < L; ++j) row[j] = ld<Tl>(logits, t * L + j);
        for (int k = 0; k < K; ++k) idx[k] = static_cast<int>(routed[t * K + k]);
        route_row_grad(row, s, idx, dgates + t * h, picks_coef, g);
        for (int j = 0; j < L; ++j) st<Tl>(dlogits, t * L + j, g[j]);
      }
    });
  });
}

void gate_heads_forward(const void* o, DType ti, HeadStrides sd, const float* gates, void* out, DType to, int64_t B,
                        int64_t h, int64_t N, int64_t d) {
  with_type(ti, [&](auto it) {
    with_type(to, [&](auto ot) {
      using Ti = decltype(it);
      using To = decltype(ot);
      at::parallel_for(0, B * N, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t b = r / N, n = r % N;
          for (int64_t j = 0; j < h; ++j) {
            const float g = gates[r * h + j];
            const int64_t src = b * sd.b + j * sd.h + n * sd.n, dst = (r * h + j) * d;
            for (int64_t c = 0; c < d; ++c) st<To>(out, dst + c, ld<Ti>(o, src + c) * g);
          }
        }
      });
    });
  });
}

void gate_heads_backward(const void* dout, DType to, const void* o, DType ti, HeadStrides sd, const float* gates,
                         void* d_o, float* dgates, int64_t B, int64_t h, int64_t N, int64_t d) {
  with_type(ti, [&](auto it) {
    with_type(to, [&](auto ot) {
      using Ti = decltype(it);
      using To = decltype(ot);
      at::parallel_for(0, B * N, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t b = r / N, n = r % N;
          for (int64_t j = 0; j < h; ++j) {
            const float g = gates[r * h + j];
            const int64_t src = b * sd.b + j * sd.h + n * sd.n, row = (r * h + j) * d;
            float acc = 0.f;
            for (int64_t c = 0; c < d; ++c) {
              const float go = ld<To>(dout, row + c);
              st<Ti>(d_o, row + c, go * g);
              acc += go * ld<Ti>(o, src + c);
            }
            dgates[r * h + j] = acc;
          }
        }
      });
    });
  });
}

}  // namespace cpu
}  // namespace moh::nn::fused
