#pragma once
// Throughput of the two training steps and of class-conditional sampling, on random data of the model's shape:
//   moh bench train  --model NAME --batch B   one optimizer step of the trainers (classifier: CE + β·aux, AdamW,
//                                              clip 1.0; DiT: hybrid loss + β·aux, AdamW) — step time, images/s,
//                                              FLOPs counted by FlopCounter, achieved TFLOP/s and MFU;
//   moh bench sample --model NAME --batch B   a DiT reverse chain with CFG (default 250 DDPM steps) — images/s.
// MFU = 3 × forward FLOPs × images/s / peak (the usual convention: backward ≈ 2 × forward). The peak is --peak-tflops,
// else the rate of a large matrix product in the run's precision measured in the same run (fp32 for bf16 on a CPU
// without native bf16, whose bf16 product is a slow fallback), so the figure says how close the step comes to what
// the GEMMs of this machine allow.
namespace moh::bench {

/// `moh bench train ...` (see --help).
int train_bench_main(int argc, char** argv);
/// `moh bench sample ...` (see --help).
int sample_bench_main(int argc, char** argv);

}  // namespace moh::bench
