#include "bench/attention_bench.h"

#include "bench/common.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cxxopts.hpp>
#include <functional>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/parse.h"
#include "vision/nn/attention_core.h"
#include "vision/nn/moh_attention.h"

namespace moh::bench {

using nn::MoHAttention;
using nn::MoHAttentionOptions;

std::pair<int64_t, int64_t> moh_split(int64_t heads, double active) {
  int64_t a = std::clamp<int64_t>(static_cast<int64_t>(std::floor(active * heads + 0.5)), 1, heads);
  int64_t hs = std::max<int64_t>(1, a / 2);
  return {hs, a - hs};
}

int64_t batch_for_seq(int64_t base, int64_t seq) {
  int64_t b = base;
  for (int64_t s = 256; s < seq; s *= 4) b /= 4;
  return std::max<int64_t>(1, b);
}

namespace {

struct Case {
  std::string mode;  // mha | dense | sparse
  double active = 1.0;
  int64_t hs = 0, k = 0;
};

// One case ready to run: closures for the forward (no grad) and forward+backward passes.
struct Prepared {
  std::function<void()> fwd, fwdbwd;
};

Prepared prepare(const std::string& scope, const Case& c, int64_t B, int64_t N, int64_t C, int64_t h,
                 const AttentionBenchOptions& o) {
  torch::manual_seed(o.seed);
  nn::MoHAttentionOptions ao(C, h);
  if (c.mode != "mha") ao.moh(c.hs, c.k);
  ao.path = c.mode == "sparse" ? AttentionPath::sparse : AttentionPath::dense;
  ao.fused = o.fused;
  nn::MoHAttention attn(ao);
  const c10::Device dev = bench_device(o.device);
  const auto opts = torch::TensorOptions().device(dev).dtype(bench_dtype(o.dtype, dev));
  attn->to(dev, opts.dtype().toScalarType());
  const int64_t d = C / h;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  torch::Tensor x = torch::randn({B, N, C}, opts);
  Prepared p;
  if (scope == "module") {
    torch::Tensor gy = torch::randn({B, N, C}, opts);
    torch::Tensor xg = x.clone().requires_grad_(true);
    p.fwd = [attn, x, dev]() mutable {  // inference: eval mode, no autograd
      torch::NoGradGuard ng;
      attn->eval();
      (void)attn->forward(x);
      wait_for(dev);
    };
    p.fwdbwd = [attn, xg, gy, dev]() mutable {  // training step: aux loss included
      attn->train();
      auto out = attn->forward(xg);
      torch::Tensor loss = (out.out * gy).sum();
      if (out.aux_loss.defined()) loss = loss + out.aux_loss;
      loss.backward();
      wait_for(dev);
    };
    return p;
  }
  // core: q, k, v and the routing are inputs; only attention + gating/gather/scatter is timed.
  nn::HeadRouting routing;
  if (c.mode != "mha") {
    torch::NoGradGuard ng;
    routing = attn->router.route(x.reshape({B * N, C}), false);
  }
  auto make = [&] { return torch::randn({B, h, N, d}, opts).requires_grad_(true); };
  torch::Tensor q = make(), k = make(), v = make(), gy = torch::randn({B, N, h * d}, opts);
  torch::Tensor gates = routing.gates.defined() ? routing.gates.detach().requires_grad_(true) : torch::Tensor();
  torch::Tensor routed = routing.routed;
  std::string mode = c.mode;
  int64_t hs = c.hs;
  const bool fused = o.fused;
  auto run = [=]() -> torch::Tensor {
    if (mode == "mha") return nn::attend(q, k, v, scale, {}, fused).transpose(1, 2).reshape({B, N, h * d});
    if (mode == "dense") return nn::mix_heads_dense(q, k, v, gates, scale, fused);
    nn::QuerySource qs;
    qs.q = q;
    return nn::mix_heads_sparse(qs, k, v, gates, routed, h, hs, scale, fused);
  };
  p.fwd = [run, dev] {
    torch::NoGradGuard ng;
    (void)run();
    wait_for(dev);
  };
  p.fwdbwd = [run, gy, dev] {
    (run() * gy).sum().backward();
    wait_for(dev);
  };
  return p;
}

}  // namespace

std::vector<AttentionBenchRow> run_attention_bench(const AttentionBenchOptions& o, bool log) {
  std::vector<AttentionBenchRow> rows;
  for (const auto& scope : o.scopes)
    for (int64_t seq : o.seqs)
      for (auto [dim, heads] : o.dims) {
        const int64_t B = batch_for_seq(o.batch, seq);
        // Distinct cases to time. The dense path computes every head whatever the split (only gate values differ),
        // so it is timed once per configuration and shared by the requested fractions; sparse is timed per distinct
        // (h_s, K); fractions that map to the same split share its measurement.
        std::vector<Case> cases{{"mha", 1.0, 0, 0}};
        std::vector<std::pair<double, size_t>> requested;  // (active, index of its sparse case)
        for (double a : o.actives) {
          auto [hs, k] = moh_split(heads, a);
          if (cases.size() == 1) cases.push_back({"dense", a, hs, k});
          size_t found = 0;
          for (size_t i = 2; i < cases.size(); ++i)
            if (cases[i].hs == hs && cases[i].k == k) found = i;
          if (!found) {
            found = cases.size();
            cases.push_back({"sparse", a, hs, k});
          }
          requested.push_back({a, found});
        }
        std::vector<Prepared> prepared;
        for (const auto& c : cases) prepared.push_back(prepare(scope, c, B, seq, dim, heads, o));
        std::vector<std::function<void()>> f, fb;
        for (const auto& p : prepared) f.push_back(p.fwd), fb.push_back(p.fwdbwd);
        std::vector<double> fwd = interleaved_medians(f, o.warmup, o.runs);
        std::vector<double> fwdbwd = interleaved_medians(fb, o.warmup, o.runs);
        auto emit = [&](size_t i, double active, const Case& c) {
          AttentionBenchRow r;
          r.scope = scope;
          r.mode = c.mode;
          r.seq = seq;
          r.dim = dim;
          r.heads = heads;
          r.batch = B;
          r.shared = c.hs;
          r.topk = c.k;
          r.active = active;
          r.active_actual = c.mode == "mha" ? 1.0 : static_cast<double>(c.hs + c.k) / heads;
          r.fwd_ms = fwd[i];
          r.fwdbwd_ms = fwdbwd[i];
          r.fwd_ratio = fwd[i] / fwd[0];
          r.fwdbwd_ratio = fwdbwd[i] / fwdbwd[0];
          rows.push_back(r);
          if (log) {
            std::ostringstream s;
            s << std::fixed << std::setprecision(3) << scope << " seq=" << seq << " dim=" << dim << " h=" << heads
              << " B=" << B << " " << c.mode;
            if (c.mode != "mha") s << " active=" << r.active_actual << " (h_s=" << c.hs << ", K=" << c.k << ")";
            s << " fwd " << r.fwd_ms << " ms (x" << r.fwd_ratio << ")  fwd+bwd " << r.fwdbwd_ms << " ms (x"
              << r.fwdbwd_ratio << ")";
            std::cerr << s.str() << std::endl;
          }
        };
        emit(0, 1.0, cases[0]);
        for (auto [a, i] : requested) {
          emit(1, a, {"dense", a, cases[i].hs, cases[i].k});
          emit(i, a, cases[i]);
        }
      }
  return rows;
}

template <class T>
static std::vector<T> parse_list(const std::string& s, const std::string& flag) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::optional<T> v;
    if constexpr (std::is_integral_v<T>)
      v = parse_int(item);
    else
      v = parse_double(item);
    if (!v) throw UserError("--" + flag, "expected a comma-separated list of numbers, got \"" + s + "\"", "");
    out.push_back(*v);
  }
  return out;
}

int attention_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "MHA vs MoH dense vs MoH sparse attention timings (median of --runs after --warmup)");
  auto flag = opts.add_options();
  flag("json", "print rows as a JSON list");
  flag("seqs", "sequence lengths", cxxopts::value<std::string>()->default_value("196,256,1024,4096"));
  flag("dims", "dim:heads pairs", cxxopts::value<std::string>()->default_value("384:6,768:12"));
  flag("actives", "active-head fractions", cxxopts::value<std::string>()->default_value("0.5,0.75,0.9"));
  flag("scopes", "core,module", cxxopts::value<std::string>()->default_value("core,module"));
  flag("runs", "timed runs (median)", cxxopts::value<int>()->default_value("10"));
  flag("warmup", "untimed runs before timing", cxxopts::value<int>()->default_value("0"));
  flag("batch", "batch at seq <= 256 (divided by 4 per 4x longer sequence, at least 1)",
       cxxopts::value<int64_t>()->default_value("8"));
  flag("threads", "intra-op threads (0 = LibTorch default)", cxxopts::value<int>()->default_value("0"));
  flag("fused",
       "the fused attention core instead of matmul-softmax-matmul: scaled_dot_product_attention (LibTorch "
       "2.1+), the one-pass CPU kernel on 1.13 (vision/nn/attention_cpu.h)");
  flag("device", "cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("cpu"));
  flag("dtype", "fp32, bf16 or fp16 (CUDA): the layers' weights and inputs",
       cxxopts::value<std::string>()->default_value("fp32"));
  flag("h,help", "show this help");
  cxxopts::ParseResult args;
  if (!parse_bench_flags(opts, argc, argv, args)) return 0;
  AttentionBenchOptions o;
  o.seqs = parse_list<int64_t>(args["seqs"].as<std::string>(), "seqs");
  o.actives = parse_list<double>(args["actives"].as<std::string>(), "actives");
  o.dims.clear();
  for (const auto& p : [&] {
         std::vector<std::string> v;
         std::stringstream ss(args["dims"].as<std::string>());
         std::string i;
         while (std::getline(ss, i, ',')) v.push_back(i);
         return v;
       }()) {
    auto colon = p.find(':');
    if (colon == std::string::npos)
      throw UserError("--dims", "expected dim:heads pairs, got \"" + p + "\"", "e.g. 384:6,768:12");
    const std::optional<int64_t> dim = parse_int(p.substr(0, colon)), heads = parse_int(p.substr(colon + 1));
    if (!dim || !heads) throw UserError("--dims", "expected dim:heads pairs, got \"" + p + "\"", "e.g. 384:6,768:12");
    o.dims.push_back({*dim, *heads});
  }
  o.scopes.clear();
  std::stringstream ss(args["scopes"].as<std::string>());
  for (std::string s; std::getline(ss, s, ',');) {
    if (s != "core" && s != "module") throw UserError("--scopes", "unknown scope \"" + s + "\"", "core or module");
    o.scopes.push_back(s);
  }
  o.runs = args["runs"].as<int>();
  o.warmup = args["warmup"].as<int>();
  o.batch = args["batch"].as<int64_t>();
  if (o.runs < 1 || o.warmup < 0 || o.batch < 1) throw UserError(argv[0], "--runs and --batch must be >= 1", "");
  if (int t = args["threads"].as<int>(); t > 0) torch::set_num_threads(t);
  o.fused = args.count("fused") > 0;
  o.device = args["device"].as<std::string>(), o.dtype = args["dtype"].as<std::string>();
  (void)bench_dtype(o.dtype, bench_device(o.device));  // a bad --device / --dtype before any work
  auto rows = run_attention_bench(o, true);
  if (args.count("json")) {
    nlohmann::json out = nlohmann::json::array();
    const nlohmann::json machine = machine_record();
    for (const auto& r : rows)
      out.push_back({{"machine", machine},
                     {"scope", r.scope},
                     {"seq", r.seq},
                     {"dim", r.dim},
                     {"heads", r.heads},
                     {"batch", r.batch},
                     {"active", r.active},
                     {"active_actual", r.active_actual},
                     {"shared", r.shared},
                     {"topk", r.topk},
                     {"mode", r.mode},
                     {"fused", o.fused},
                     {"device", o.device},
                     {"dtype", o.dtype},
                     {"fwd_ms", r.fwd_ms},
                     {"fwdbwd_ms", r.fwdbwd_ms},
                     {"fwd_ratio", r.fwd_ratio},
                     {"fwdbwd_ratio", r.fwdbwd_ratio},
                     // what attention_path: auto runs for this layer shape on this device (module scope: per call)
                     {"auto_picks", config::to_string(nn::choose_attention_path(
                                        AttentionPath::automatic, r.active_actual, r.seq, bench_device(o.device)))}});
    std::cout << out.dump(1) << std::endl;
  } else {
    std::cout << "| scope | seq | dim/heads | batch | mode | active (h_s+K)/h | fwd ms | fwd ratio | fwd+bwd ms | "
                 "fwd+bwd ratio |\n"
              << "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : rows)
      std::cout << std::fixed << std::setprecision(2) << "| " << r.scope << " | " << r.seq << " | " << r.dim << "/"
                << r.heads << " | " << r.batch << " | " << r.mode << " | " << r.active_actual << " (" << r.shared << "+"
                << r.topk << ") | " << r.fwd_ms << " | " << std::setprecision(3) << r.fwd_ratio << " | "
                << std::setprecision(2) << r.fwdbwd_ms << " | " << std::setprecision(3) << r.fwdbwd_ratio << " |\n";
  }
  return 0;
}

}  // namespace moh::bench
