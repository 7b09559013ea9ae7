#include "vision/nn/fused_rows.h"

#include <type_traits>

#include "vision/nn/cpu_simd.h"
#include "vision/nn/fused_math.h"

// Vector values only inside the always-inlined helpers of one instruction set's function (cpu_simd.h).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moh::nn::fused::rows {

namespace {

using simd::load;
using simd::splat;
using simd::store;
using simd::stored_as;
using simd::Vec;

// One element of a stored type as fp32 and back (float, or bf16 bits rounded to nearest even).
MOH_INLINE_INTO_CLONES float get1(const float* p) {
  return *p;
}
MOH_INLINE_INTO_CLONES float get1(const uint16_t* p) {
  return simd::bf16_to_float(*p);
}
MOH_INLINE_INTO_CLONES void put1(float* p, float v) {
  *p = v;
}
MOH_INLINE_INTO_CLONES void put1(uint16_t* p, float v) {
  *p = simd::float_to_bf16(v);
}
// v as a tensor of storage type T holds it (rnd<T> of fused_math.h on one element).
template <class T>
MOH_INLINE_INTO_CLONES float round1(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return simd::bf16_to_float(simd::float_to_bf16(v));
}

// Σ x and Σ (x − mu)² of one row: vector lanes over the whole blocks of W, then the tail.
template <int W>
MOH_INLINE_INTO_CLONES float row_total(const float* x, int64_t D) {
  Vec<W> acc = {};
  int64_t c = 0;
  for (; c + W <= D; c += W) acc += load<W>(x + c);
  float s = simd::lane_sum<W>(acc);
  for (; c < D; ++c) s += x[c];
  return s;
}
template <int W>
MOH_INLINE_INTO_CLONES float row_squared_deviations(const float* x, int64_t D, float mu) {
  Vec<W> acc = {};
  int64_t c = 0;
  for (; c + W <= D; c += W) {
    const Vec<W> dev = load<W>(x + c) - mu;
    acc += dev * dev;
  }
  float s = simd::lane_sum<W>(acc);
  for (; c < D; ++c) s += (x[c] - mu) * (x[c] - mu);
  return s;
}

template <int W, class To>
MOH_INLINE_INTO_CLONES void ln_forward_rows(const float* x, int64_t n, int64_t D, const float* shift, const float* fac,
                                            float eps, To* out, float* mean, float* rstd) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * D;
    To* orow = out + r * D;
    const float mu = row_total<W>(xr, D) / static_cast<float>(D);
    const float rs = inv_std(row_squared_deviations<W>(xr, D, mu) / static_cast<float>(D), eps);
    mean[r] = mu, rstd[r] = rs;
    int64_t c = 0;
    for (; c + W <= D; c += W)
      store<W>(orow + c, modulate<Vec<W>>((load<W>(xr + c) - mu) * rs, load<W>(shift + c), load<W>(fac + c)));
    for (; c < D; ++c) put1(orow + c, modulate((xr[c] - mu) * rs, shift[c], fac[c]));
  }
}

template <int W, class Ty>
MOH_INLINE_INTO_CLONES void ln_backward_rows(const Ty* dy, const float* x, int64_t n, int64_t D, const float* fac,
                                             const float* mean, const float* rstd, float* dx, float* dsh, float* dsc) {
  for (int64_t r = 0; r < n; ++r) {
    const Ty* dr = dy + r * D;
    const float *xr = x + r * D, mu = mean[r], rs = rstd[r];
    Vec<W> sg = {}, sgx = {};
    int64_t c = 0;
    for (; c + W <= D; c += W) {
      const Vec<W> d = load<W>(dr + c), xh = (load<W>(xr + c) - mu) * rs,
                   g = modulate_grad<Vec<W>>(d, load<W>(fac + c));
      sg += g, sgx += g * xh;
      store<W>(dsh + c, load<W>(dsh + c) + d);
      store<W>(dsc + c, load<W>(dsc + c) + d * xh);
    }
    float tg = simd::lane_sum<W>(sg), tgx = simd::lane_sum<W>(sgx);
    for (int64_t t = c; t < D; ++t) {
      const float d = get1(dr + t), xh = (xr[t] - mu) * rs, g = modulate_grad(d, fac[t]);
      tg += g, tgx += g * xh;
      dsh[t] += d, dsc[t] += d * xh;
    }
    const float mg = tg / static_cast<float>(D), mgx = tgx / static_cast<float>(D);
    for (c = 0; c + W <= D; c += W) {
      const Vec<W> xh = (load<W>(xr + c) - mu) * rs, g = modulate_grad<Vec<W>>(load<W>(dr + c), load<W>(fac + c));
      store<W>(dx + r * D + c, layer_norm_grad<Vec<W>>(g, xh, splat<W>(mg), splat<W>(mgx), splat<W>(rs)));
    }
    for (; c < D; ++c) {
      const float xh = (xr[c] - mu) * rs, g = modulate_grad(get1(dr + c), fac[c]);
      dx[r * D + c] = layer_norm_grad(g, xh, mg, mgx, rs);
    }
  }
}

// gate_residual<Tb> of fused_math.h (x + rnd_Tb(gate · branch)), W lanes at a time.
template <int W, class Tb>
MOH_INLINE_INTO_CLONES void gate_forward_rows(const float* x, const Tb* gate, const Tb* branch, float* out, int64_t n,
                                              int64_t D) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * D;
    const Tb* br = branch + r * D;
    int64_t c = 0;
    for (; c + W <= D; c += W)
      store<W>(out + r * D + c, load<W>(xr + c) + stored_as<W, Tb>(load<W>(gate + c) * load<W>(br + c)));
    for (; c < D; ++c) out[r * D + c] = xr[c] + round1<Tb>(get1(gate + c) * get1(br + c));
  }
}

template <int W, class Tb>
MOH_INLINE_INTO_CLONES void gate_backward_rows(const float* dout, const Tb* gate, const Tb* branch, Tb* dbranch,
                                               float* dg, int64_t n, int64_t D) {
  for (int64_t r = 0; r < n; ++r) {
    const float* dr = dout + r * D;
    const Tb* br = branch + r * D;
    int64_t c = 0;
    for (; c + W <= D; c += W) {
      const Vec<W> d = stored_as<W, Tb>(load<W>(dr + c));  // the product's gradient, in its type
      store<W>(dbranch + r * D + c, d * load<W>(gate + c));
      store<W>(dg + c, load<W>(dg + c) + stored_as<W, Tb>(d * load<W>(br + c)));
    }
    for (; c < D; ++c) {
      const float d = round1<Tb>(dr[c]);
      put1(dbranch + r * D + c, d * get1(gate + c));
      dg[c] += round1<Tb>(d * get1(br + c));
    }
  }
}

}  // namespace

MOH_SIMD_VARIANTS(ln_modulate_forward, ln_forward_rows,
                  (const float* x, int64_t n, int64_t D, const float* shift, const float* factor, float eps, float* out,
                   float* mean, float* rstd),
                  (x, n, D, shift, factor, eps, out, mean, rstd))
MOH_SIMD_VARIANTS(ln_modulate_forward, ln_forward_rows,
                  (const float* x, int64_t n, int64_t D, const float* shift, const float* factor, float eps,
                   uint16_t* out, float* mean, float* rstd),
                  (x, n, D, shift, factor, eps, out, mean, rstd))
MOH_SIMD_VARIANTS(ln_modulate_backward, ln_backward_rows,
                  (const float* dy, const float* x, int64_t n, int64_t D, const float* factor, const float* mean,
                   const float* rstd, float* dx, float* dshift, float* dscale),
                  (dy, x, n, D, factor, mean, rstd, dx, dshift, dscale))
MOH_SIMD_VARIANTS(ln_modulate_backward, ln_backward_rows,
                  (const uint16_t* dy, const float* x, int64_t n, int64_t D, const float* factor, const float* mean,
                   const float* rstd, float* dx, float* dshift, float* dscale),
                  (dy, x, n, D, factor, mean, rstd, dx, dshift, dscale))
MOH_SIMD_VARIANTS(gate_residual_forward, gate_forward_rows,
                  (const float* x, const float* gate, const float* branch, float* out, int64_t n, int64_t D),
                  (x, gate, branch, out, n, D))
MOH_SIMD_VARIANTS(gate_residual_forward, gate_forward_rows,
                  (const float* x, const uint16_t* gate, const uint16_t* branch, float* out, int64_t n, int64_t D),
                  (x, gate, branch, out, n, D))
MOH_SIMD_VARIANTS(gate_residual_backward, gate_backward_rows,
                  (const float* dout, const float* gate, const float* branch, float* dbranch, float* dgate, int64_t n,
                   int64_t D),
                  (dout, gate, branch, dbranch, dgate, n, D))
MOH_SIMD_VARIANTS(gate_residual_backward, gate_backward_rows,
                  (const float* dout, const uint16_t* gate, const uint16_t* branch, uint16_t* dbranch, float* dgate,
                   int64_t n, int64_t D),
                  (dout, gate, branch, dbranch, dgate, n, D))

}  // namespace moh::nn::fused::rows
