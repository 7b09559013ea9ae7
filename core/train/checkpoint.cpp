#include "core/train/checkpoint.h"
#include "core/train/optimizer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/tensorboard.h"
#include "core/io/torch_file.h"

namespace moh {

namespace fs = std::filesystem;

TensorMap module_tensor_views(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& p : module.named_parameters()) out[p.key()] = p.value().detach();
  for (const auto& b : module.named_buffers()) out[b.key()] = b.value().detach();
  return out;
}

TensorMap module_tensors(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& p : module.named_parameters()) out[p.key()] = p.value().detach().to(at::kCPU).clone();
  for (const auto& b : module.named_buffers()) out[b.key()] = b.value().detach().to(at::kCPU).clone();
  return out;
}

namespace {

// Assigns a module's parameters and buffers by name from a source: `shape(name)` is null when the source lacks the
// name, `read(name)` gives its values; `names` lists every name of the source (for "unexpected" errors).
template <class Shape, class Read>
void assign_module(torch::nn::Module& module, const std::vector<std::string>& names, const std::string& origin,
                   bool allow_missing, Shape&& shape, Read&& read) {
  torch::NoGradGuard ng;
  std::set<std::string> seen;
  auto assign = [&](const std::string& name, at::Tensor& dst) {
    const std::vector<int64_t>* s = shape(name);
    if (!s) {
      // BatchNorm's step counter is absent from many official files (PyTorch fills it in the same way).
      if (allow_missing || (name.size() >= 20 && name.compare(name.size() - 20, 20, ".num_batches_tracked") == 0))
        return;
      throw UserError("weights " + origin, "missing tensor '" + name + "'",
                      "the file does not match this model (or pass --allow-missing)");
    }
    if (*s != dst.sizes().vec())
      throw UserError("weights " + origin,
                      "tensor '" + name + "' has shape " + c10::str(c10::IntArrayRef(*s)) + ", the model expects " +
                          c10::str(dst.sizes()),
                      "wrong model variant?");
    dst.copy_(read(name));
    seen.insert(name);
  };
  for (auto& p : module.named_parameters()) assign(p.key(), p.value());
  for (auto& b : module.named_buffers()) assign(b.key(), b.value());
  for (const auto& name : names)
    if (!seen.count(name))
      throw UserError("weights " + origin, "unexpected tensor '" + name + "'", "the file does not match this model");
}

}  // namespace

void load_module_tensors(torch::nn::Module& module, const TensorMap& tensors, const std::string& origin,
                         bool allow_missing) {
  std::vector<std::string> names;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : tensors) names.push_back(name), shapes[name] = t.sizes().vec();
  assign_module(
      module, names, origin, allow_missing,
      [&](const std::string& n) {
        auto it = shapes.find(n);
        return it == shapes.end() ? nullptr : &it->second;
      },
      [&](const std::string& n) { return tensors.at(n); });
}

void load_module_file(torch::nn::Module& module, const std::string& path, bool allow_missing,
                      const std::function<std::string(const std::string&)>& rename) {
  const SafetensorsReader file(path);
  std::vector<std::string> names;
  std::map<std::string, const SafetensorsEntry*> by_name;  // the module's names
  for (const auto& e : file.entries()) {
    names.push_back(rename ? rename(e.name) : e.name);
    by_name[names.back()] = &e;
  }
  assign_module(
      module, names, path, allow_missing,
      [&](const std::string& n) {
        auto it = by_name.find(n);
        return it == by_name.end() ? nullptr : &it->second->shape;
      },
      [&](const std::string& n) { return file.read(*by_name.at(n)); });  // one tensor in memory at a time
}

namespace {

template <class State>
bool save_state(torch::optim::OptimizerParamState* s, const std::string& name, TensorMap& out) {
  auto* st = dynamic_cast<State*>(s);
  if (!st) return false;
  out[name + ".exp_avg"] = st->exp_avg().detach();  // views of the live state (saved before the next step)
  out[name + ".exp_avg_sq"] = st->exp_avg_sq().detach();
  out[name + ".step"] = at::tensor(static_cast<int64_t>(st->step()), at::kLong);
  return true;
}

}  // namespace

TensorMap optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& module) {
  TensorMap out;
  auto& state = optimizer.state();
  for (const auto& p : module.named_parameters()) {
    auto it = state.find(optimizer_state_key(state, p.value()));
    if (it == state.end()) continue;  // not stepped yet (or frozen)
    if (!save_state<torch::optim::AdamWParamState>(it->second.get(), p.key(), out) &&
        !save_state<torch::optim::AdamParamState>(it->second.get(), p.key(), out))
      throw std::runtime_error("optimizer_tensors: only Adam/AdamW state is supported");
  }
  return out;
}

void load_optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& module, const TensorMap& t,
                            const std::string& origin) {
  auto& state = optimizer.state();
  state.clear();
  for (const auto& p : module.named_parameters()) {
    auto a = t.find(p.key() + ".exp_avg"), b = t.find(p.key() + ".exp_avg_sq"), s = t.find(p.key() + ".step");
    if (a == t.end() && b == t.end() && s == t.end()) continue;
    if (a == t.end() || b == t.end() || s == t.end() || a->second.sizes() != p.value().sizes())
      throw UserError("checkpoint " + origin, "optimizer state of '" + p.key() + "' is incomplete or mis-shaped",
                      "the checkpoint is damaged or from another model");
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->exp_avg(a->second.to(p.value().device()).clone());
    st->exp_avg_sq(b->second.to(p.value().device()).clone());
    st->step(s->second.item<int64_t>());
    state[optimizer_state_key(state, p.value())] = std::move(st);
  }
}

std::string save_checkpoint(const std::string& run_dir, const TrainerState& state, const TensorMap& model,
                            const TensorMap& optimizer, const std::string& config_yaml, const TensorMap& rng,
                            const TensorMap& ema, const std::vector<std::pair<std::string, TensorMap>>& extra) {
  const std::string root = run_dir + "/checkpoints";
  fs::create_directories(root);
  remove_stale_temporaries(root);
  char name[32];
  std::snprintf(name, sizeof name, "%07lld", static_cast<long long>(state.step));
  const std::string final_dir = root + "/" + name;
  {
    AtomicDir dir(final_dir, /*replace=*/true);
    save_safetensors(dir.path() + "/model.safetensors", model, {{"format", "pt"}});
    save_safetensors(dir.path() + "/optimizer.safetensors", optimizer);
    save_safetensors(dir.path() + "/rng.safetensors", rng);
    if (!ema.empty()) save_safetensors(dir.path() + "/ema.safetensors", ema, {{"format", "pt"}});
    for (const auto& [name, tensors] : extra) save_safetensors(dir.path() + "/" + name + ".safetensors", tensors);
    nlohmann::json j{{"format_version", kCheckpointFormat},
                     {"step", state.step},
                     {"epoch", state.epoch},
                     {"batch", state.batch},
                     {"skipped", state.skipped},
                     {"best_metric", state.best_metric}};
    if (!state.written_by.is_null()) j["written_by"] = state.written_by;
    write_file_atomic(dir.path() + "/trainer_state.json", j.dump(1) + "\n");
    write_file_atomic(dir.path() + "/config.resolved.yaml", config_yaml);
    dir.commit();
  }
  write_file_atomic(root + "/latest", std::string(name) + "\n");
  return final_dir;
}

CheckpointWeights load_checkpoint_weights(torch::nn::Module& module, const Checkpoint& ckpt, bool ema,
                                          bool require_ema) {
  if (ema && !ckpt.has_ema && require_ema)
    throw UserError("checkpoint " + ckpt.dir, "has no EMA weights", "train with train.ema_decay > 0, or drop --ema");
  const bool use_ema = ema && ckpt.has_ema;
  const std::string file = ckpt.dir + (use_ema ? "/ema.safetensors" : "/model.safetensors");
  const TensorMap& loaded = use_ema ? ckpt.ema : ckpt.model;
  if (!loaded.empty())
    load_module_tensors(module, loaded, file);
  else
    load_module_file(module, file);  // a checkpoint opened without its tensors: read this file alone
  return {use_ema ? "ema" : "model", file};
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const std::string latest = run_dir + "/checkpoints/latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(latest, ec))) return std::nullopt;
  if (!fs::is_regular_file(latest, ec))
    throw UserError("run directory " + run_dir, "checkpoints/latest is not a file", "it names the newest checkpoint");
  std::string name = read_file(latest, "checkpoint pointer");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
  // A checkpoint of this run: a plain name under checkpoints/ (written as 7 digits), never a path elsewhere.
  const bool plain = !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
  const std::string dir = run_dir + "/checkpoints/" + name;
  const std::string hint =
      "restore that checkpoint, or resume from one explicitly with --resume " + run_dir + "/checkpoints/<step>";
  if (!plain)
    throw UserError("run directory " + run_dir, "checkpoints/latest names '" + name + "', not a checkpoint of this run",
                    hint);
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(dir + "/trainer_state.json", ec))
    throw UserError("run directory " + run_dir,
                    "checkpoints/latest names '" + name + "', which is " +
                        (fs::exists(dir, ec) ? "not a complete checkpoint" : "missing"),
                    hint);
  return dir;
}

namespace {

// The generator states a checkpoint restores must be what this LibTorch's CPU generator takes (set_state would
// otherwise fail deep inside LibTorch, or worse, accept a state from another layout).
void check_checkpoint_rng(const TensorMap& rng, const std::string& origin) {
  const int64_t n = cpu_rng_state().numel();
  const std::string hint = "the checkpoint is damaged or was written by another program";
  auto state_ok = [&](const at::Tensor& t, int64_t dim) {
    return t.scalar_type() == at::kByte && t.dim() == dim && t.size(dim - 1) == n;
  };
  if (!rng.count("cpu") || !state_ok(rng.at("cpu"), 1))
    throw UserError("checkpoint " + origin,
                    "'cpu' is not a CPU generator state (" + std::to_string(n) + " bytes, uint8)", hint);
  if (rng.count("cpu_ranks") && (!state_ok(rng.at("cpu_ranks"), 2) || rng.at("cpu_ranks").size(0) < 1))
    throw UserError("checkpoint " + origin, "'cpu_ranks' is not a (ranks, " + std::to_string(n) + ") uint8 matrix",
                    hint);
  if (rng.count("amp_scaler")) {
    const at::Tensor& s = rng.at("amp_scaler");
    if (!s.is_floating_point() || s.numel() != 2 || !at::isfinite(s).all().item<bool>() || s[0].item<double>() <= 0)
      throw UserError("checkpoint " + origin, "'amp_scaler' is not (scale > 0, growth tracker)", hint);
  }
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path, bool tensors) {
  std::string dir = path;
  if (!fs::exists(dir + "/trainer_state.json")) {
    auto latest = latest_checkpoint(path);
    if (!latest)
      throw UserError("checkpoint " + path, "not a checkpoint or run directory",
                      "no trainer_state.json or checkpoints/latest");
    dir = *latest;
  }
  Checkpoint c;
  c.dir = dir;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(dir + "/trainer_state.json", "checkpoint"));
    if (j.at("format_version").get<int>() != kCheckpointFormat)
      throw UserError("checkpoint " + dir, "unsupported format_version " + j.at("format_version").dump(), "");
    c.state.step = j.at("step").get<int64_t>();
    c.state.epoch = j.at("epoch").get<int64_t>();
    c.state.batch = j.value("batch", int64_t{0});  // absent in checkpoints taken at epoch ends before it existed
    c.state.skipped = j.value("skipped", int64_t{0});
    c.state.best_metric = j.value("best_metric", 0.0);
    c.state.written_by = j.value("written_by", nlohmann::json());
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint " + dir + "/trainer_state.json", std::string("malformed: ") + e.what(), "");
  }
  c.has_ema = fs::exists(dir + "/ema.safetensors");
  c.config_yaml = read_file(dir + "/config.resolved.yaml", "checkpoint");
  if (tensors) {
    c.model = load_safetensors(dir + "/model.safetensors").tensors;
    c.optimizer = load_safetensors(dir + "/optimizer.safetensors").tensors;
    c.rng = load_safetensors(dir + "/rng.safetensors").tensors;
    if (c.has_ema) c.ema = load_safetensors(dir + "/ema.safetensors").tensors;
    check_checkpoint_rng(c.rng, dir + "/rng.safetensors");
  } else if (!fs::is_regular_file(dir + "/model.safetensors")) {
    throw UserError("checkpoint " + dir, "has no model.safetensors", "the checkpoint is incomplete");
  }
  if (c.state.step < 0 || c.state.epoch < 0 || c.state.batch < 0 || c.state.skipped < 0 ||
      c.state.skipped > c.state.batch)
    throw UserError("checkpoint " + dir + "/trainer_state.json", "negative step, epoch or batch",
                    "the checkpoint is damaged");
  return c;
}

namespace {
// Keeps only metrics lines of steps already covered by the checkpoint being resumed, so the log of a resumed run
// equals that of an uninterrupted one.
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::istringstream in(read_file(path));
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
    } catch (...) {  // a line cut by a kill: drop it
    }
  }
  write_file_atomic(path, kept);
}
}  // namespace

TensorMap load_weights_tensors(const std::string& path, const std::string& key) {
  if (fs::is_directory(path)) {  // one of this toolkit's checkpoints: only the file asked for is read
    const Checkpoint c = load_checkpoint(path, /*tensors=*/false);
    if (key.empty() || key == "model") return load_safetensors(c.dir + "/model.safetensors").tensors;
    if (key == "ema" && c.has_ema) return load_safetensors(c.dir + "/ema.safetensors").tensors;
    throw UserError("weights " + path, "checkpoint has no '" + key + "' weights",
                    key == "ema" ? "this run kept no EMA" : "use model or ema");
  }
  // .safetensors, or any torch.save file (zip or legacy): official checkpoints load as they are.
  return load_weights_file(path, key);
}

void load_initial_weights(torch::nn::Module& module, const std::string& path, const std::string& key,
                          bool allow_missing) {
  load_module_tensors(module, load_weights_tensors(path, key), path + (key.empty() ? "" : " [" + key + "]"),
                      allow_missing);
}

RunDirLock::RunDirLock(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const std::string path = run_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw UserError("run directory " + run_dir, std::string("cannot create its lock file: ") + std::strerror(errno),
                    "choose a writable --run-dir");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw UserError("run directory " + run_dir, "is in use by another training process",
                    "wait for it to end, or choose another --run-dir");
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

MetricsWriter start_run_dir(const std::string& run_dir, const std::string& config_yaml,
                            std::optional<int64_t> resumed_step, bool tensorboard) {
  fs::create_directories(run_dir + "/config_history");
  char name[48];
  std::snprintf(name, sizeof name, "/config_history/from_step_%07lld.yaml",
                static_cast<long long>(resumed_step.value_or(0)));
  write_file_atomic(run_dir + name, config_yaml);  // the config in effect from that step on (resumes keep the earlier)
  write_file_atomic(run_dir + "/config.resolved.yaml", config_yaml);
  if (resumed_step) truncate_metrics(run_dir + "/metrics.jsonl", *resumed_step);
  MetricsWriter metrics(run_dir + "/metrics.jsonl", /*truncate=*/!resumed_step);
  if (tensorboard) {
    auto tb = std::make_shared<TensorBoardWriter>(run_dir + "/tb", resumed_step);
    // four spaces: a Markdown code block (the text plugin renders Markdown)
    std::string text, line;
    std::istringstream in(config_yaml);
    while (std::getline(in, line)) text += "    " + line + "\n";
    tb->add_text("config", text, resumed_step.value_or(0));
    metrics.mirror_to(std::move(tb));
  }
  return metrics;
}

std::optional<Checkpoint> resolve_resume(const std::string& run_dir, const std::string& resume) {
  if (resume == "auto") {
    if (latest_checkpoint(run_dir)) return load_checkpoint(run_dir);
    // No pointer: a run killed before its first checkpoint starts again; checkpoints without a pointer are an error.
    std::error_code ec;
    if (fs::is_directory(run_dir + "/checkpoints", ec))
      for (const auto& e : fs::directory_iterator(run_dir + "/checkpoints", ec))
        if (fs::is_regular_file(e.path() / "trainer_state.json", ec))
          throw UserError("run directory " + run_dir, "holds checkpoints but no checkpoints/latest",
                          "resume from one explicitly: --resume " + e.path().string());
    return std::nullopt;  // the trainer says so once every input has been checked
  }
  if (!resume.empty()) return load_checkpoint(resume);
  if (fs::exists(run_dir + "/checkpoints") || fs::exists(run_dir + "/metrics.jsonl"))
    throw UserError("run directory " + run_dir, "already holds a run",
                    "continue it with --resume auto, or choose --run-dir");
  return std::nullopt;
}

}  // namespace moh
