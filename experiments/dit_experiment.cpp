#include "experiments/dit_experiment.h"

#include "core/error.h"
#include "core/parse.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "core/train/retention.h"
#include "diffusion/diffusion_schedule.h"
#include "diffusion/objective.h"
#include "experiments/experiment_data.h"
#include "experiments/model_family.h"
#include "experiments/repa_encoders.h"

namespace moh::experiments {

diffusion::DiTOptions dit_options_for(const ModelConfig& model, int64_t latent_factor) {
  diffusion::DiTOptions o = diffusion::dit_options(model.name);
  if (model.num_classes > 0) o.num_classes = model.num_classes;
  if (model.img_size > 0) {  // pixel space: image side = input side; latents: image side / the VAE's factor
    const int64_t f = std::max<int64_t>(latent_factor, 1);
    if (model.img_size % f != 0)
      throw UserError("config: model.img_size", "must be a multiple of " + std::to_string(f) + " with this vae",
                      "e.g. 256 (" + std::to_string(256 / f) + "×" + std::to_string(256 / f) + " latents)");
    o.input_size = model.img_size / f;
  }
  if (!model.attention.empty())
    throw UserError("config: model.attention", "per-stage overrides are for classifiers",
                    "pick a DiT or MoH-DiT variant");
  std::vector<int64_t> heads;
  for (int64_t i = 0; i < o.depth; ++i) heads.push_back(o.layer(i).num_heads);
  const auto split = moh_split(model, heads, /*one_for_all=*/true, "layer");
  if (!split.empty()) {  // a dense (or other MoH) variant with this head split, widths unchanged
    o.head_dim = o.layer(0).head_dim_resolved();
    o.heads = o.shared = o.topk = {};
    for (int64_t i = 0; i < o.depth; ++i) {
      o.heads.push_back({heads[i], 1});
      o.shared.push_back({split[i].shared, 1});
      o.topk.push_back({split[i].topk, 1});
    }
    o.attention = AttentionMode::moh;
  }
  o.path = model.attention_path;
  o.router = model.router;
  o.fused = model.fused;
  if (model.norm != NormKind::automatic) o.norm = model.norm;
  if (model.mlp != MlpKind::automatic) o.mlp = model.mlp;
  if (model.pos != PosKind::automatic) o.pos = model.pos;
  o.qk_norm = o.qk_norm || model.qk_norm;
  o.overlap_output = o.overlap_output || model.overlap_output;
  return o;
}

diffusion::DiTOptions dit_options_for(const ExperimentConfig& cfg) {
  const int64_t factor =
      cfg.diffusion.vae == VaeKind::none ? 0 : diffusion::vae_spec(cfg.diffusion.vae).options.factor();
  diffusion::DiTOptions o = dit_options_for(cfg.model, factor);
  o.grad_checkpoint = cfg.train.grad_checkpoint == GradCheckpoint::blocks;
  if (cfg.train.paired) o.init_seed = cfg.train.seed;
  o.validate();
  return o;
}

double attention_map_bytes(const diffusion::DiTOptions& o, int64_t rank_batch) {
  int64_t heads = 0;  // the widest layer (MoH-DiT-L/XL: 24-head layers above num_heads = 16)
  for (int64_t i = 0; i < o.depth; ++i) heads = std::max(heads, o.layer(i).num_heads);
  const double tokens = static_cast<double>(o.num_patches());
  return static_cast<double>(rank_batch) * static_cast<double>(heads) * tokens * tokens * 4.0;
}

void check_attention_memory(const diffusion::DiTOptions& o, int64_t rank_batch, const DeviceMemory& memory) {
  const double bytes = attention_map_bytes(o, rank_batch);
  if (bytes > static_cast<double>(memory.bytes))
    throw UserError("config: model.img_size",
                    std::to_string(o.num_patches()) + " tokens at " + std::to_string(rank_batch) +
                        " images per rank need at least " + std::to_string(static_cast<int64_t>(bytes / (1 << 30))) +
                        " GiB for one attention map, more than the " + std::to_string(memory.bytes >> 30) + " GiB of " +
                        memory.name,
                    "lower model.img_size or data.batch_size");
}

void check_sampling_topk(const diffusion::DiTOptions& o, int64_t topk, const std::string& key) {
  if (topk == -1) return;
  int64_t pool = 0, shared = -1;  // the smallest routed pool and shared count: every routed layer takes the same K
  for (int64_t i = 0; i < o.depth; ++i)
    if (const auto l = o.layer(i); l.mode == AttentionMode::moh && l.topk > 0) {
      pool = pool == 0 ? l.routed_pool() : std::min(pool, l.routed_pool());
      shared = shared < 0 ? l.shared_heads : std::min(shared, l.shared_heads);
    }
  if (pool == 0)
    throw UserError("config: " + key, "the model has no routed MoH layer whose K could change",
                    "remove " + key + (key == "sampling.topk" ? " (or --topk)" : ""));
  if (topk < 0 || topk > pool)
    throw UserError(
        "config: " + key,
        std::to_string(topk) + " is outside 0 … " + std::to_string(pool) + " (the smallest routed pool of the model)",
        "-1 keeps the trained K");
  if (topk == 0 && shared == 0)
    throw UserError("config: " + key, "0 leaves a routed layer without shared heads with no head at all",
                    "choose K ≥ 1");
}

void check_head_budgets(const diffusion::DiTOptions& o, const SamplingConfig& sc) {
  check_sampling_topk(o, sc.topk, "sampling.topk");
  for (size_t i = 0; i < sc.topk_schedule.size(); ++i)
    check_sampling_topk(o, sc.topk_schedule[i], "sampling.topk_schedule[" + std::to_string(i) + "]");
  check_sampling_topk(o, sc.guide_topk, "sampling.guide_topk");
  if (sc.guide_topk != -1 && !(sc.cfg_scale > 1.0))
    throw UserError("config: sampling.guide_topk", "sets the unconditional branch of CFG, and guidance is off",
                    "set sampling.cfg_scale > 1 or remove sampling.guide_topk");
}

namespace {

// sampling.steps of a solver sampler: a step count within what the objective allows.
int64_t solver_steps(const ExperimentConfig& cfg, const std::string& name) {
  const std::string& s = cfg.sampling.steps;
  const std::optional<int64_t> parsed = parse_int(s);
  if (!parsed)
    throw UserError("config: sampling.steps", "\"" + s + "\" is not a step count for " + name,
                    "the ODE solvers take a number of steps, e.g. 25");
  const int64_t n = *parsed;
  const diffusion::ObjectiveRecord& objective = diffusion::objective_record(cfg.diffusion.objective);
  const bool capped = objective.solver_steps_within_chain;  // the solver walks the training chain's ᾱ
  if (n < 2 || (capped && n > cfg.diffusion.steps))
    throw UserError("config: sampling.steps",
                    name + " takes " +
                        (capped ? "2 … " + std::to_string(cfg.diffusion.steps) + " steps (diffusion.steps)"
                                : std::string(">= 2 steps")) +
                        ", got " + s,
                    objective.steps_hint);
  return n;
}

}  // namespace

diffusion::SampleOptions sample_options_for(const ExperimentConfig& cfg) {
  const SamplingConfig& sc = cfg.sampling;
  diffusion::SampleOptions so;
  so.sampler = sc.sampler;
  so.solver = sc.solver;
  so.cfg_scale = sc.cfg_scale;
  so.cfg_channels = sc.cfg_channels;
  so.clip_denoised = sc.clip_denoised;
  so.cfg_interval = {sc.cfg_interval.at(0), sc.cfg_interval.at(1)};
  so.train_steps = cfg.diffusion.steps;
  so.objective = cfg.diffusion.objective;
  so.flow = diffusion::FlowProcess(cfg.diffusion.flow);
  so.topk = sc.topk;
  so.topk_schedule = sc.topk_schedule;
  so.guide_topk = sc.guide_topk;
  so.cuda_graph = sc.cuda_graph == CudaGraphMode::automatic;
  if (sc.precision == Precision::automatic)
    throw UserError("config: sampling.precision", "auto is a training setting",
                    "use tf32 (DiT's sample.py; fp32 on a CPU), fp32, bf16 or fp16 (CUDA)");
  const std::string name = config::to_string(sc.sampler);
  const diffusion::ObjectiveRecord& objective = diffusion::objective_record(cfg.diffusion.objective);
  if (!diffusion::runs_on(sc.sampler, cfg.diffusion.objective))
    throw UserError(
        "config: sampling.sampler",
        name + " does not run on a " + objective.model_word + " model (diffusion.objective: " + objective.name + ")",
        "use " + diffusion::samplers_for(cfg.diffusion.objective));
  if (sc.solver.timestep_shift < 0 ||
      (sc.solver.timestep_shift > 0 &&
       (!objective.warps_flow_grid || !diffusion::sampler_record(sc.sampler).timestep_shift)))
    throw UserError(
        "config: sampling.timestep_shift",
        sc.solver.timestep_shift < 0 ? "must be >= 0" : "warps the grid of the flow euler and heun samplers only",
        "set it to 0, or sample a flow model with euler or heun");
  if (!diffusion::is_ode_sampler(sc.sampler)) {
    diffusion::space_timesteps(cfg.diffusion.steps, sc.steps);  // a UserError if the spec cannot respace T
    return so;
  }
  so.ode_steps = solver_steps(cfg, name);
  return so;
}

void validate_dit_experiment(const ExperimentConfig& cfg, bool training, bool sampling) {
  const diffusion::DiTOptions o = dit_options_for(cfg);
  // One attention map of the widest layer for a rank's batch (a lower bound of what training holds) must fit the
  // memory of the device the run trains on.
  check_attention_memory(o, cfg.data.batch_size / std::max<int64_t>(1, cfg.train.processes),
                         device_memory(cfg.train.device));
  if (cfg.train.accum_steps != 1) throw UserError("config: train.accum_steps", "must be 1 for diffusion training", "");
  if (sampling && cfg.sampling.cfg_scale > 1.0 && o.class_dropout_prob <= 0)
    throw UserError("config: sampling.cfg_scale", cfg.model.name + " has no null class (class_dropout_prob = 0)",
                    "set sampling.cfg_scale=1");
  if (sampling && cfg.sampling.cfg_scale > 1.0 && cfg.sampling.cfg_channels == CfgChannels::three && o.in_channels < 3)
    throw UserError(
        "config: sampling.cfg_channels",
        "three (DiT's latent quirk) needs at least 3 channels, the model has " + std::to_string(o.in_channels),
        "set sampling.cfg_channels=all");
  if (sampling) check_head_budgets(o, cfg.sampling);
  // Pixel-space samples are images: 1 or 3 channels (a latent variant's 4 would be refused only at the merge).
  if (sampling && cfg.diffusion.vae == VaeKind::none && o.in_channels != 1 && o.in_channels != 3)
    throw UserError("config: model.name",
                    cfg.model.name + " samples " + std::to_string(o.in_channels) +
                        "-channel latents, but diffusion.vae is none (pixel space)",
                    "choose a pixel-space variant (DiT-Pixel/4, MoH-DiT-Pixel/4-75) or set diffusion.vae");
  const diffusion::ObjectiveRecord& objective = diffusion::objective_record(cfg.diffusion.objective);
  if (objective.validate) objective.validate(cfg.diffusion, o, cfg.model.name);  // its settings against the model
  sample_options_for(cfg);  // "sampling.steps" must respace diffusion.steps, or count an ODE solver's steps
  if (!training) return;
  check_repa(cfg, o, /*files=*/false);  // the encoder file and the shards' images: when training starts
  const bool latent = cfg.data.dataset == DatasetKind::latents;
  if (cfg.diffusion.vae != VaeKind::none && !latent)
    throw UserError(
        "config: data.dataset", "a latent DiT (vae: sd or vavae) trains from pre-extracted latents",
        "run `moh extract-latents CONFIG.yaml --out DIR`, then set data.dataset: latents and data.root: DIR");
  if (latent && cfg.diffusion.vae == VaeKind::none)
    throw UserError("config: diffusion.vae", "data.dataset: latents needs the VAE they were encoded with",
                    "set diffusion.vae: sd or vavae");
  if (!sampling) check_data_shape(cfg, {o.in_channels, o.input_size});  // sampling reads no data
}

DiTTrainData::DiTTrainData(const ExperimentConfig& cfg, const diffusion::DiTOptions& mo)
    : cfg_(cfg), latent_(cfg.data.dataset == DatasetKind::latents) {
  if (latent_) {
    latent_meta_ = datasets::read_latent_meta(cfg.data.root);
    if (latent_meta_.channels != mo.in_channels || latent_meta_.size != mo.input_size)
      throw UserError("config: model",
                      cfg.model.name + " takes " + std::to_string(mo.in_channels) + "×" +
                          std::to_string(mo.input_size) + "² latents, " + cfg.data.root + " holds " +
                          std::to_string(latent_meta_.channels) + "×" + std::to_string(latent_meta_.size) + "²",
                      "set model.img_size to " + std::to_string(latent_meta_.image_size));
    if (static_cast<int64_t>(latent_meta_.classes.size()) > mo.num_classes)
      throw UserError(
          "config: model.num_classes",
          std::to_string(mo.num_classes) + " classes, the latents have " + std::to_string(latent_meta_.classes.size()),
          "");
    if (diffusion::vae_spec(cfg.diffusion.vae).channel_stats && latent_meta_.channel_mean.empty())
      throw UserError("latents " + cfg.data.root, "meta.json has no channel statistics (vae: vavae standardises them)",
                      "extract them with this toolkit's moh extract-latents (vae: vavae)");
    latents_ =
        std::make_shared<const datasets::LatentStore>(cfg.data.root, latent_meta_);  // every shard's header checked
    return;
  }
  pixels_ = experiments::load_split(cfg, true, mo.in_channels);
  tf_.size = mo.input_size;
  tf_.hflip = cfg.data.hflip;
  tf_.shift = 0;  // no padding: side = input size
  tf_.mean = 0.5;
  tf_.std = 0.5;
  if (pixels_.images.size(1) != mo.input_size || pixels_.images.size(2) != mo.input_size)
    throw UserError("config: model",
                    cfg.model.name + " takes " + std::to_string(mo.input_size) + " px images, the data is " +
                        std::to_string(pixels_.images.size(1)) + " px",
                    "choose a matching variant");
  const int64_t channels = pixels_.images.dim() == 4 ? pixels_.images.size(3) : 1;
  if (channels != mo.in_channels)
    throw UserError("config: model",
                    cfg.model.name + " takes " + std::to_string(mo.in_channels) + " channels, the data has " +
                        std::to_string(channels),
                    "choose a matching variant");
  const int64_t labels_max = pixels_.labels.max().item<int64_t>();
  if (labels_max >= mo.num_classes)
    throw UserError(
        "config: model.num_classes",
        std::to_string(mo.num_classes) + " classes, the data has labels up to " + std::to_string(labels_max), "");
}

int64_t DiTTrainData::size() const {
  if (!latent_) return pixels_.size();
  return cfg_.data.limit_train > 0 ? std::min(cfg_.data.limit_train, latent_meta_.count) : latent_meta_.count;
}

std::unique_ptr<BatchStream> DiTTrainData::epoch(int64_t epoch, int rank, int world, int64_t start_batch) const {
  const auto seed = static_cast<uint64_t>(cfg_.train.seed);
  if (latent_)  // a permutation of the whole set per epoch; every rank draws the global batch and reads its rows
    return std::make_unique<datasets::LatentLoader>(latents_, cfg_.data.batch_size, seed, epoch, cfg_.data.limit_train,
                                                    rank, world, start_batch, !cfg_.repa.encoder.empty());
  return std::make_unique<datasets::EpochLoader>(pixels_, tf_, cfg_.data.batch_size / world, /*train=*/true, seed,
                                                 epoch, start_batch, true, 2, rank,
                                                 world);  // the rank's strided share of every batch
}

datasets::LatentNorm trained_latent_norm(const ExperimentConfig& cfg) {
  const diffusion::VaeSpec& spec = diffusion::vae_spec(cfg.diffusion.vae);
  if (!spec.channel_stats) return {spec.scale, {}, {}};
  const datasets::LatentMeta meta = datasets::read_latent_meta(cfg.data.root);  // a UserError when missing
  if (meta.channel_mean.empty())
    throw UserError("latents " + cfg.data.root,
                    "meta.json has no channel statistics, which vae: " + std::string(spec.name) + " latents need",
                    "extract them again with this toolkit's moh extract-latents");
  return meta.norm();
}

diffusion::AutoencoderKL load_sampling_vae(const ExperimentConfig& cfg, const RunContext& ctx) {
  if (cfg.diffusion.vae == VaeKind::none) return diffusion::AutoencoderKL(nullptr);
  const diffusion::VaeSpec& spec = diffusion::vae_spec(cfg.diffusion.vae);
  if (cfg.diffusion.vae_weights.empty())
    throw UserError("config: diffusion.vae_weights", "is empty, but latent samples must be decoded", spec.weights_hint);
  const datasets::LatentNorm norm = trained_latent_norm(cfg);  // first: a missing statistic is refused without work
  diffusion::AutoencoderKL vae = diffusion::load_vae(cfg.diffusion.vae, cfg.diffusion.vae_weights, spec.weights_hint);
  vae->latents = norm;
  vae->eval();
  vae->to(ctx.device);
  return vae;
}

namespace {

// The widths of a checkpoint's REPA projectors (projectors.N.4.weight: (z_dim, projector_dim)); empty without REPA.
std::vector<int64_t> repa_widths(const std::string& checkpoint_dir) {
  const SafetensorsReader file(checkpoint_dir + "/model.safetensors");
  std::vector<int64_t> widths;
  while (const SafetensorsEntry* e = file.find("projectors." + std::to_string(widths.size()) + ".4.weight"))
    widths.push_back(e->shape.at(0));
  return widths;
}

}  // namespace

LoadedDiT load_dit_checkpoint(const std::string& path, bool prefer_ema) {
  const FamilyCheckpoint opened =
      open_family_checkpoint(path, names_of(diffusion::dit_variants()), "DiT", "pass a DiT run");
  diffusion::DiT model(
      with_repa_projectors(dit_options_for(opened.cfg), opened.cfg.repa, repa_widths(opened.ckpt.dir)));
  return load_family_model(opened, std::move(model), prefer_ema, /*require_ema=*/false);
}

}  // namespace moh::experiments
