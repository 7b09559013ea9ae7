#include "experiments/sampling_run.h"

#include <torch/utils.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/dist/distributed.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "core/io/sha256.h"
#include "core/io/tensorboard.h"
#include "core/parse.h"
#include "core/platform/amp.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "datasets/fashion_mnist.h"
#include "datasets/image_grid.h"
#include "diffusion/head_load.h"
#include "diffusion/objective.h"
#include "diffusion/sample_set.h"
#include "experiments/dit_experiment.h"
#include "experiments/dit_family.h"
#include "experiments/registry.h"

namespace moh::experiments {

// The runs of commands are written in the families' words.
using namespace ::moh::diffusion;

namespace fs = std::filesystem;

namespace {

// The grid shows at most kGridCols images of a row and kGridRows rows (a 50k-sample run stays a small PNG).
constexpr int64_t kGridCols = 16, kGridRows = 32;

// A checkpoint's EMA (or --raw trained) weights, read alone; only sampling.* may change.
LoadedDiT checkpoint_model(const SamplingRequest& r) {
  LoadedDiT m = load_dit_checkpoint(r.checkpoint, !r.raw);
  for (const auto& s : r.sets)
    if (s.rfind("sampling.", 0) != 0)
      throw UserError("--set " + s, "only sampling.* can be changed when sampling a checkpoint",
                      "e.g. sampling.cfg_scale=4");
  if (!r.config.empty()) {
    const ExperimentConfig named = load_experiment(r.config, r.sets);  // its sampling: is checked below, merged
    if (named.model.name != m.cfg.model.name)
      throw UserError("checkpoint " + r.checkpoint,
                      "was trained as " + m.cfg.model.name + ", the config describes " + named.model.name,
                      "pass the matching config, or only --checkpoint");
    m.cfg.sampling = named.sampling;
  } else if (!r.sets.empty()) {
    m.cfg = with_overrides(m.cfg, r.sets);
  }
  validate_experiment(m.cfg, ExperimentUse::sample);
  return m;
}

// CONFIG.yaml's model: untrained, or initialised from model.weights (e.g. the official DiT-XL-2-256x256.pt).
LoadedDiT config_model(const SamplingRequest& r) {
  if (r.config.empty())
    throw UserError("moh sample", "--untrained / --weights need CONFIG.yaml",
                    "moh sample CONFIG.yaml --weights DiT-XL-2-256x256.pt");
  LoadedDiT m;
  m.cfg = load_experiment(r.config, r.sets);
  validate_experiment(m.cfg, ExperimentUse::sample);
  if (find_model_family(m.cfg.model.name).measure != ModelFamily::Measure::sample_fid)
    throw UserError("config: model.name", m.cfg.model.name + " is not a DiT variant", "moh info --list");
  torch::manual_seed(m.cfg.train.seed);
  m.model = DiT(dit_options_for(m.cfg));
  if (!r.untrained && !m.cfg.model.weights.empty()) {
    load_initial_weights(*m.model, m.cfg.model.weights, m.cfg.model.weights_key, m.cfg.model.weights_allow_missing);
    m.weights = m.cfg.model.weights + (m.cfg.model.weights_key.empty() ? "" : " [" + m.cfg.model.weights_key + "]");
    m.weights_file = m.cfg.model.weights;
  }
  m.model->eval();
  return m;
}

std::vector<int64_t> parse_label_list(const std::string& mode, int64_t num_classes) {
  std::vector<int64_t> list;
  if (mode == "balanced" || mode == "random") return list;
  std::stringstream ss(mode);
  for (std::string item; std::getline(ss, item, ',');) {
    const std::optional<int64_t> label = parse_int(item);
    if (!label || *label < 0 || *label >= num_classes)
      throw UserError("--labels " + mode, "'" + item + "' is not a class index below " + std::to_string(num_classes),
                      "balanced, random or a list like 1,2,3");
    list.push_back(*label);
  }
  return list;
}

// Everything that decides the images: parts on disk from another plan must not be mixed in.
nlohmann::json sampling_plan(const LoadedDiT& m, const SamplingRequest& r, const at::Tensor& labels) {
  const SamplingConfig& sc = m.cfg.sampling;
  const at::Tensor l = labels.contiguous();
  std::string label_bytes(static_cast<const char*>(l.data_ptr()), l.nbytes());
  return {{"model", m.cfg.model.name},
          {"checkpoint", r.checkpoint},
          {"weights", m.weights},
          // Parts sampled from other weights at the same path and step (a run trained again) are refused.
          {"weights_sha256", m.weights_file.empty() ? nlohmann::json() : nlohmann::json(sha256_file(m.weights_file))},
          {"step", m.step},
          {"sampling", config::to_json(sc)},  // every sampling.* setting, as the schema names them
          {"count", labels.size(0)},
          {"labels", r.labels},
          {"labels_hash", std::hash<std::string>{}(label_bytes)}};
}

// Refuses parts of another sampling run in DIR/parts (before any work); rank 0 records this run's plan there.
void check_parts_plan(const std::string& parts, const nlohmann::json& plan, const std::string& out,
                      dist::Group& group) {
  const std::string path = parts + "/plan.json";
  if (fs::exists(path)) {
    nlohmann::json old;
    try {
      old = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception&) {
      throw UserError("--out " + out, path + " is damaged", "remove " + parts + " to start the sampling afresh");
    }
    for (const auto& [k, v] : plan.items())
      if (old.value(k, nlohmann::json()) != v)
        throw UserError("--out " + out,
                        "holds parts of another sampling run (" + k + ": " + old.value(k, nlohmann::json()).dump() +
                            " there, " + v.dump() + " now)",
                        "remove " + parts + " or choose another --out");
  }
  group.barrier();  // every rank has looked before rank 0 writes
  if (group.is_main() && !fs::exists(path)) {
    fs::create_directories(parts);
    write_file_atomic(path, plan.dump(1) + "\n");
  }
}

std::vector<std::string> class_names_for(const SamplingRequest& r, const ExperimentConfig& cfg, int64_t num_classes) {
  std::vector<std::string> names;
  if (!r.class_names_file.empty()) {
    std::stringstream lines(read_file(r.class_names_file, "--class-names"));
    for (std::string l; std::getline(lines, l);) names.push_back(l);
  } else if (cfg.data.dataset == DatasetKind::fashion_mnist && num_classes == 10) {
    names = datasets::fashion_mnist_classes();
  }
  return names;
}

// The grid: balanced labels give one class per row (a row label), others a caption under every tile.
struct GridLayout {
  int64_t cols = 0;
  std::vector<int64_t> shown;  // sample indices, in tile order
  std::vector<std::string> row_labels, tile_labels;
};

GridLayout grid_layout(const std::string& mode, const at::Tensor& labels, int64_t per_class, int64_t num_classes,
                       const std::vector<std::string>& names) {
  auto name_of = [&](int64_t k) {
    return k < static_cast<int64_t>(names.size()) ? names[static_cast<size_t>(k)] : "class " + std::to_string(k);
  };
  const int64_t n = labels.size(0), row_len = mode == "balanced" ? per_class : kGridCols;
  GridLayout g;
  g.cols = std::min(row_len, kGridCols);
  for (int64_t r = 0; r * row_len < n && r < kGridRows; ++r) {
    for (int64_t c = 0; c < g.cols && r * row_len + c < n; ++c) {
      g.shown.push_back(r * row_len + c);
      if (mode != "balanced") g.tile_labels.push_back(name_of(labels[r * row_len + c].item<int64_t>()));
    }
    if (mode == "balanced") g.row_labels.push_back(name_of(r % num_classes));
  }
  return g;
}

}  // namespace

at::Tensor sampling_labels(const std::string& mode, int64_t n, int64_t num_classes, int64_t per_class) {
  if (mode == "random") return at::randint(0, num_classes, {n}, at::kLong);  // sample_ddp: random classes
  const std::vector<int64_t> list = parse_label_list(mode, num_classes);
  if (!list.empty()) {
    const auto len = static_cast<int64_t>(list.size());
    return at::tensor(list, at::kLong).repeat({(n + len - 1) / len}).narrow(0, 0, n);
  }
  return at::arange(n, at::kLong).div(per_class, "floor").remainder(num_classes);  // rows of per_class
}

namespace {

// Samples this rank's share of the batches not on disk yet into part files; returns how many were on disk.
// The chain a run walks and how: built once from the experiment's sampling section.
struct SamplingChain {
  GaussianDiffusion chain;
  SampleOptions options;
};

SamplingChain sampling_chain_of(const ExperimentConfig& cfg) {
  return {sampling_chain(cfg.sampling.sampler, cfg.diffusion.steps, cfg.sampling.steps), sample_options_for(cfg)};
}

int64_t sample_missing_parts(LoadedDiT& m, const SamplingChain& sc_chain, AutoencoderKL& vae, const at::Tensor& labels,
                             const RunContext& ctx, dist::Group& group, const std::string& parts,
                             SamplingSummary& out) {
  const SamplingConfig& sc = m.cfg.sampling;
  m.model->to(ctx.device);
  const GaussianDiffusion& chain = sc_chain.chain;
  SampleSetOptions so;
  so.sampling = sc_chain.options;
  so.batch_size = sc.batch_size;
  so.seed = static_cast<uint64_t>(sc.seed);
  const int64_t n = labels.size(0), batches = (n + sc.batch_size - 1) / sc.batch_size;
  const std::vector<int64_t> missing = missing_sample_batches(n, parts, sc.batch_size);
  group.barrier();  // every rank listed the parts before any is written
  const std::vector<int64_t> mine = rank_share(missing, group);
  Progress progress("sampling", static_cast<int64_t>(mine.size()) * sampler_steps(so.sampling, chain), "step",
                    group.is_main() ? -1 : 2);
  const int64_t nfe = sample_parts(m.model, chain, vae, labels, mine, so, ctx, parts, [&] { progress.advance(); });
  out.nfe = planned_nfe(so.sampling, chain);  // an adaptive sampler's (−1): the mean this rank measured
  if (out.nfe < 0 && !mine.empty())
    out.nfe = (nfe + static_cast<int64_t>(mine.size()) / 2) / static_cast<int64_t>(mine.size());
  progress.finish();
  group.barrier();  // every part is on disk
  return batches - static_cast<int64_t>(missing.size());
}

// The memory check of a sampling run (core/platform/memory_preflight.h), before any image is sampled: one network
// evaluation of the real model at a batch (twice the rows under classifier-free guidance, as the sampler runs it) and
// the decoding of its latents, without gradients, at the run's precision and on its device. Zeros as inputs: the check
// draws no random number, so the samples do not depend on it.
std::string check_sampling_memory(LoadedDiT& m, AutoencoderKL& vae, int64_t n, const RunContext& ctx) {
  const DiTOptions mo = m.model->options;
  const bool guided = m.cfg.sampling.cfg_scale > 1;
  MemoryProbe probe;
  probe.what = "sampling " + m.cfg.model.name;
  probe.other = guided ? "sampling.cfg_scale to 1 (one network batch instead of two)" : "";
  probe.step = "sampling";
  DiT model = m.model;
  probe.build = [model, vae, mo, guided](const RunContext& c, int64_t batch) {
    return std::function<void()>([model, vae, mo, guided, c, batch]() mutable {
      const torch::NoGradGuard no_grad;
      const AutocastScope autocast(c);
      const int64_t rows = guided ? 2 * batch : batch;
      const auto on = at::TensorOptions().device(c.device);
      const at::Tensor x = at::zeros({rows, mo.in_channels, mo.input_size, mo.input_size}, on);
      model->forward(x, at::full({rows}, 1, on.dtype(at::kLong)), at::zeros({rows}, on.dtype(at::kLong)));
      if (vae) vae->decode(vae->latents.to_vae(x.narrow(0, 0, batch)));
    });
  };
  MemoryPlan plan;
  plan.batch = std::min(m.cfg.sampling.batch_size, n);  // n images take one batch of n
  plan.sharing = ctx.device.is_cuda() ? 1 : ctx.local_world;
  plan.setting = "sampling.batch_size (--batch)";
  m.model->to(ctx.device);
  return preflight_memory(probe, ctx, plan).line;
}

// A checkpoint of a run that logs to TensorBoard (log.tensorboard): the grid goes into the run's tb/ as an image at
// the checkpoint's step, tagged by sampler, steps and guidance, so the run's samples line up with its curves.
void grid_to_tensorboard(const LoadedDiT& m, const std::string& png_path) {
  if (!m.cfg.log.tensorboard || m.dir.empty() || m.step < 0) return;
  const fs::path ckpt = fs::absolute(m.dir);
  if (ckpt.parent_path().filename() != "checkpoints") return;
  const SamplingConfig& sc = m.cfg.sampling;
  std::ostringstream tag;  // one tag per setting: e.g. samples/dpm++2m 12, cfg 4
  tag << "samples/" << sampler_record(sc.sampler).name << " " << sc.steps << ", cfg " << sc.cfg_scale;
  const std::string dir = ckpt.parent_path().parent_path().string() + "/tb";
  try {  // the samples are written: a run directory we cannot add to (read-only, shared) only costs the image
    TensorBoardWriter tb(dir);
    tb.add_png(tag.str(), read_file(png_path), m.step);
  } catch (const std::exception& e) {
    std::cerr << "warning: the grid was not added to " << dir << ": " << e.what() << "\n";
  }
}

// Rank 0: samples.npz streamed from the parts (the grid's tiles picked on the way), grid.png, sampling.json.
void write_sampling_outputs(const LoadedDiT& m, const SamplingChain& sc_chain, const SamplingRequest& r,
                            const at::Tensor& labels, nlohmann::json info, SamplingSummary& out) {
  const SamplingConfig& sc = m.cfg.sampling;
  const DiTOptions& mo = m.model->options;
  const GridLayout grid =
      grid_layout(r.labels, labels, sc.per_class, mo.num_classes, class_names_for(r, m.cfg, mo.num_classes));
  std::vector<at::Tensor> tiles;
  size_t next = 0;
  const std::string parts = r.out + "/parts";
  merge_sample_parts(parts, labels, sc.batch_size, r.out + "/samples.npz",
                     [&](int64_t first, const at::Tensor& images) {
                       for (; next < grid.shown.size() && grid.shown[next] < first + images.size(0); ++next)
                         tiles.push_back(images[grid.shown[next] - first].clone());
                     });
  fs::remove_all(parts);
  out.grid = datasets::write_grid(r.out + "/grid.png", at::stack(tiles), grid.cols, mo.input_size < 64 ? 3 : 1,
                                  grid.row_labels, grid.tile_labels);
  if (out.grid) grid_to_tensorboard(m, r.out + "/grid.png");
  info["chain_steps"] = sampler_steps(sc_chain.options, sc_chain.chain);
  // A guided step counts 2; an adaptive sampler's count is the mean over the batches rank 0 sampled (null when all
  // were on disk already).
  info["nfe_per_image"] = out.nfe >= 0 ? nlohmann::json(out.nfe) : nlohmann::json();
  info["nfe_measured"] = sampler_record(sc_chain.options.sampler).adaptive;
  info["seconds"] = out.seconds;
  info["checkpoint"] = r.checkpoint.empty() ? "untrained" : r.checkpoint;
  info["precision"] = out.precision;  // as computed: tf32 is fp32 on a CPU
  if (m.step < 0) info["step"] = nullptr;
  write_file_atomic(r.out + "/sampling.json", info.dump(1) + "\n");
}

// Rank 0: DIR/head_load.json and its heat maps (by timestep; by class for few classes).
void write_routing(const DiTHeadLoadStats& routing, const SamplingRequest& r, const LoadedDiT& m,
                   SamplingSummary& out) {
  nlohmann::json j = routing.to_json();
  j["model"] = m.cfg.model.name;
  j["checkpoint"] = r.checkpoint.empty() ? "untrained" : r.checkpoint;
  j["sampler"] = config::to_string(m.cfg.sampling.sampler);
  j["steps"] = m.cfg.sampling.steps;
  j["cfg_scale"] = m.cfg.sampling.cfg_scale;
  write_file_atomic(r.out + "/head_load.json", j.dump(1) + "\n");
  const bool png = routing.write_pngs(r.out + "/head_load_timestep.png", r.out + "/head_load_class.png",
                                      class_names_for(r, m.cfg, m.model->options.num_classes));
  out.head_load = routing.summary() + "; " + r.out + "/head_load.json" +
                  (png ? ", " + r.out + "/head_load_timestep.png" : std::string(" (no PNG: built without OpenCV)"));
}

}  // namespace

SamplingSummary run_sampling(const SamplingRequest& r) {
  check_output_dir(r.out, "--out " + r.out);  // before the model is even loaded
  if (r.checkpoint.empty() && !r.untrained && !r.weights)
    throw UserError("moh sample", "missing --checkpoint", "pass a DiT run, or CONFIG.yaml --untrained for a baseline");
  LoadedDiT m = r.checkpoint.empty() ? config_model(r) : checkpoint_model(r);
  if (!r.class_names_file.empty()) class_names_for(r, m.cfg, 0);  // a missing file is refused before any work
  const DiTOptions& mo = m.model->options;
  if (r.head_load && mo.routed_layers() == 0)
    throw UserError("--head-load", "model " + m.cfg.model.name + " has no routed MoH layers",
                    "head load needs a MoH-DiT (attention: moh with topk > 0)");
  const SamplingConfig& sc = m.cfg.sampling;
  if (r.head_load && sc.topk == 0 && sc.topk_schedule.empty() && sc.guide_topk <= 0)
    throw UserError("--head-load", "sampling.topk 0 runs the shared heads alone, so no routed head is picked",
                    "drop --head-load or choose --topk ≥ 1");
  const std::vector<int64_t> list = parse_label_list(r.labels, mo.num_classes);
  const int64_t n = r.num_samples   ? *r.num_samples
                    : !list.empty() ? static_cast<int64_t>(list.size())
                                    : mo.num_classes * m.cfg.sampling.per_class;
  if (n <= 0) throw UserError("--num-samples", "must be > 0", "");
  const RunContext ctx = RunContext::create(r.device, sc.precision, static_cast<uint64_t>(sc.seed));
  AutoencoderKL vae = load_sampling_vae(m.cfg, ctx);
  torch::manual_seed(static_cast<uint64_t>(m.cfg.sampling.seed));  // random labels: from the seed
  const at::Tensor labels = sampling_labels(r.labels, n, mo.num_classes, m.cfg.sampling.per_class);
  const nlohmann::json plan = sampling_plan(m, r, labels);
  const std::string memory = check_sampling_memory(m, vae, n, ctx);  // before anything is written
  const auto group = dist::Group::join(ctx, {{"sampling plan (sha256)", sha256_hex(plan.dump())}});
  check_parts_plan(r.out + "/parts", plan, r.out, *group);
  if (!memory.empty() && group->is_main()) std::cerr << memory << "\n";  // now that every input is accepted
  SamplingSummary out{r.out, m.weights, m.step, n};
  out.precision = precision_summary(sc.precision, ctx);
  const auto start = std::chrono::steady_clock::now();
  std::optional<DiTHeadLoadStats> routing;
  if (r.head_load) {
    routing.emplace(mo, 10, m.cfg.diffusion.steps);
    const auto& objective = diffusion::objective_record(m.cfg.diffusion.objective);
    const int64_t T = m.cfg.diffusion.steps;
    // The buckets are DDPM timesteps of a noise level: any objective's time is mapped through its noise level.
    m.model->routing_observer = [&, T](const std::vector<at::Tensor>& routed, const at::Tensor& t,
                                       const at::Tensor& y) {
      const at::Tensor times = t.to(at::kDouble).cpu().contiguous();
      at::Tensor steps = at::empty_like(times);
      for (int64_t i = 0; i < times.numel(); ++i)
        steps.data_ptr<double>()[i] = objective.chain_timestep(times.data_ptr<double>()[i], T);
      routing->add(routed, steps.to(t.device()), y);
    };
  }
  const SamplingChain chain = sampling_chain_of(m.cfg);
  out.resumed_batches = sample_missing_parts(m, chain, vae, labels, ctx, *group, r.out + "/parts", out);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.main = group->is_main();
  if (routing) {
    m.model->routing_observer = nullptr;
    routing->reduce(*group);
    if (out.main) write_routing(*routing, r, m, out);
  }
  nlohmann::json info = plan;
  info["provenance"] = provenance(ctx.device);  // rank 0's: every rank runs the same build on the same kind of device
  info["checkpoint_written_by"] = m.written_by;
  if (out.main) write_sampling_outputs(m, chain, r, labels, info, out);
  return out;
}

}  // namespace moh::experiments
