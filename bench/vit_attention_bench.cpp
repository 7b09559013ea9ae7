#include "bench/vit_attention_bench.h"

#include <torch/torch.h>

#include <cxxopts.hpp>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/common.h"
#include "bench/op_profile.h"
#include "core/error.h"
#include "vision/transnext.h"

namespace moh::bench {

namespace {

struct Row {
  int64_t stage = 0, tokens = 0, dim = 0, heads = 0, shared = 0, topk = 0, batch = 0;
  std::string mode;  // mha | dense | sparse | im2col (dense without the window kernels)
  double active = 1, fwd_ms = 0, fwdbwd_ms = 0;
  double fwd_vs_dense = 1, fwdbwd_vs_dense = 1, fwd_vs_mha = 1, fwdbwd_vs_mha = 1;
};

// Closures for one layer: forward in eval mode without autograd, forward + backward in training mode. Each waits for
// the device at its end (a GPU runs the kernels after the call returns).
std::pair<std::function<void()>, std::function<void()>> prepare(vision::TransNeXtAttention layer, const at::Tensor& x,
                                                                const at::Tensor& table, const at::Tensor& index) {
  at::Tensor gy = torch::randn_like(x), xg = x.clone().requires_grad_(true);
  const auto wait = [dev = x.device()] { wait_for(dev); };
  auto fwd = [=]() mutable {
    torch::NoGradGuard ng;
    layer->eval();
    (void)layer->forward(x, table, index);
    wait();
  };
  auto fwdbwd = [=]() mutable {
    layer->train();
    auto r = layer->forward(xg, table, index);
    at::Tensor loss = (r.out * gy).sum();
    if (r.aux_loss.defined()) loss = loss + r.aux_loss;
    loss.backward();
    wait();
  };
  return {fwd, fwdbwd};
}

}  // namespace

int vit_attention_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "MoH-ViT attention layers: MHA vs MoH dense vs MoH sparse (and dense without the window "
                        "kernels) at a variant's shapes");
  auto flag = opts.add_options();
  flag("model", "classifier variant", cxxopts::value<std::string>()->default_value("MoH-ViT-B-50"));
  flag("batch", "batch size", cxxopts::value<int64_t>()->default_value("8"));
  flag("img-size", "input side (0 = the variant's)", cxxopts::value<int64_t>()->default_value("0"));
  flag("runs", "timed runs (median)", cxxopts::value<int>()->default_value("5"));
  flag("warmup", "untimed runs before timing", cxxopts::value<int>()->default_value("1"));
  flag("threads", "intra-op threads (0 = LibTorch default)", cxxopts::value<int>()->default_value("0"));
  flag("seed", "seed of weights and inputs", cxxopts::value<uint64_t>()->default_value("0"));
  flag("device", "cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("cpu"));
  flag("dtype", "fp32, bf16 or fp16 (CUDA): the layers' weights and inputs",
       cxxopts::value<std::string>()->default_value("fp32"));
  flag("profile", "print the 12 slowest operators of each mode's forward + backward (stderr)");
  flag("json", "print rows as a JSON list");
  flag("h,help", "show this help");
  cxxopts::ParseResult args;
  if (!parse_bench_flags(opts, argc, argv, args)) return 0;
  vision::TransNeXtOptions o = vision::classifier_options(args["model"].as<std::string>());
  if (const int64_t s = args["img-size"].as<int64_t>(); s > 0) o.img_size = s;
  o.validate();
  const int64_t B = args["batch"].as<int64_t>();
  const int runs = args["runs"].as<int>(), warmup = args["warmup"].as<int>();
  if (B < 1 || runs < 1 || warmup < 0) throw UserError(argv[0], "--batch and --runs must be >= 1", "");
  if (int t = args["threads"].as<int>(); t > 0) torch::set_num_threads(t);
  const c10::Device dev = bench_device(args["device"].as<std::string>());
  const at::ScalarType dtype = bench_dtype(args["dtype"].as<std::string>(), dev);

  std::vector<Row> rows;
  for (int64_t i = 0; i < 4; ++i) {
    nn::MoHAttentionOptions moh = o.stage_attention(i);
    if (moh.mode == AttentionMode::mha || moh.topk == 0 || moh.active_heads() == moh.num_heads) continue;
    const int64_t side = o.stage_size(i), sr = o.sr_ratios[i], pool = sr > 1 ? side / sr : side;
    const int64_t pre = o.pretrain_stage_size(i), N = side * side;
    auto [table, index] = vision::relative_position_cpb(side, side, pool, pool, pre, pre);
    table = table.to(dev, dtype), index = index.to(dev);
    torch::manual_seed(args["seed"].as<uint64_t>());
    at::Tensor x = torch::randn({B, N, moh.dim}).to(dev, dtype);
    nn::MoHAttentionOptions mha(moh.dim, moh.num_heads);
    std::vector<std::string> modes{"mha", "dense", "sparse", "im2col"};
    std::vector<std::function<void()>> f, fb;
    for (const auto& mode : modes) {
      nn::MoHAttentionOptions lo = mode == "mha" ? mha : moh;
      lo.path = mode == "sparse" ? AttentionPath::sparse : AttentionPath::dense;
      torch::manual_seed(args["seed"].as<uint64_t>() + 1);
      vision::TransNeXtAttention layer(lo, side, side, sr);
      layer->window_kernels = mode != "im2col";  // the official unfold path, beside the sliding-window kernels
      layer->to(dev, dtype);
      auto [fwd, fwdbwd] = prepare(layer, x, table, index);
      f.push_back(fwd), fb.push_back(fwdbwd);
    }
    const std::vector<double> tf = interleaved_medians(f, warmup, runs), tb = interleaved_medians(fb, warmup, runs);
    if (args.count("profile"))
      for (size_t m = 0; m < modes.size(); ++m) {
        OpProfiler prof;
        fb[m]();
        std::cerr << "stage " << i + 1 << " " << modes[m] << " forward + backward, self time per operator:\n";
        const auto table = prof.table();
        for (size_t k = 0; k < table.size() && k < 12; ++k)
          std::cerr << "  " << std::setw(34) << std::left << table[k].name << std::right << std::fixed
                    << std::setprecision(2) << std::setw(9) << table[k].self_ms << " ms  " << table[k].calls
                    << " calls\n";
      }
    for (size_t m = 0; m < modes.size(); ++m) {
      Row r;
      r.stage = i + 1;
      r.tokens = N;
      r.dim = moh.dim;
      r.heads = moh.num_heads;
      r.batch = B;
      r.mode = modes[m];
      r.shared = m ? moh.shared_heads : 0;  // modes after mha are the MoH layer
      r.topk = m ? moh.topk : 0;
      r.active = m ? static_cast<double>(moh.active_heads()) / static_cast<double>(moh.num_heads) : 1.0;
      r.fwd_ms = tf[m];
      r.fwdbwd_ms = tb[m];
      r.fwd_vs_dense = tf[m] / tf[1];
      r.fwdbwd_vs_dense = tb[m] / tb[1];
      r.fwd_vs_mha = tf[m] / tf[0];
      r.fwdbwd_vs_mha = tb[m] / tb[0];
      rows.push_back(r);
      std::ostringstream s;
      s << std::fixed << std::setprecision(3) << "stage " << r.stage << " N=" << N << " C=" << r.dim << " h=" << r.heads
        << " B=" << B << " " << r.mode << " active=" << r.active << " fwd " << r.fwd_ms << " ms (x" << r.fwd_vs_dense
        << " of dense)  fwd+bwd " << r.fwdbwd_ms << " ms (x" << r.fwdbwd_vs_dense << " of dense)";
      std::cerr << s.str() << std::endl;
    }
  }
  if (rows.empty())
    throw UserError("--model", args["model"].as<std::string>() + " routes no heads in any stage",
                    "use a MoH-ViT or MoA-ViT variant");
  if (args.count("json")) {
    nlohmann::json out = nlohmann::json::array();
    const nlohmann::json machine = machine_record();
    for (const auto& r : rows)
      out.push_back({{"machine", machine},
                     {"model", args["model"].as<std::string>()},
                     {"img_size", o.img_size},
                     {"device", dev.str()},
                     {"dtype", args["dtype"].as<std::string>()},
                     {"stage", r.stage},
                     {"tokens", r.tokens},
                     {"dim", r.dim},
                     {"heads", r.heads},
                     {"shared", r.shared},
                     {"topk", r.topk},
                     {"active", r.active},
                     {"batch", r.batch},
                     {"mode", r.mode},
                     {"fwd_ms", r.fwd_ms},
                     {"fwdbwd_ms", r.fwdbwd_ms},
                     {"fwd_vs_dense", r.fwd_vs_dense},
                     {"fwdbwd_vs_dense", r.fwdbwd_vs_dense},
                     {"fwd_vs_mha", r.fwd_vs_mha},
                     {"fwdbwd_vs_mha", r.fwdbwd_vs_mha}});
    std::cout << out.dump(1) << std::endl;
  } else {
    std::cout << "| stage | tokens | C/h | batch | mode | active (h_s+K)/h | fwd ms | × dense | × MHA | fwd+bwd ms | "
                 "× dense | × MHA |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : rows)
      std::cout << std::fixed << std::setprecision(2) << "| " << r.stage << " | " << r.tokens << " | " << r.dim << "/"
                << r.heads << " | " << r.batch << " | " << r.mode << " | " << r.active << " (" << r.shared << "+"
                << r.topk << ") | " << r.fwd_ms << " | " << std::setprecision(3) << r.fwd_vs_dense << " | "
                << r.fwd_vs_mha << " | " << std::setprecision(2) << r.fwdbwd_ms << " | " << std::setprecision(3)
                << r.fwdbwd_vs_dense << " | " << r.fwdbwd_vs_mha << " |\n";
  }
  return 0;
}

}  // namespace moh::bench
