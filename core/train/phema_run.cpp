#include "core/train/phema_run.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/train/checkpoint.h"
#include "core/train/phema.h"

namespace fs = std::filesystem;

namespace moh::phema {

namespace {

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%07lld", static_cast<long long>(step));
  return name;
}

std::string sigma_name(double sigma_rel) {
  char name[64];
  std::snprintf(name, sizeof name, "sigma_rel_%.6g.safetensors", sigma_rel);
  return name;
}

// A snapshot's step, σ_rel and γ from its metadata (the file name is for people).
Snapshot read_snapshot_header(const std::string& file) {
  const SafetensorsFile f = load_safetensors(file);
  Snapshot s;
  s.file = file;
  try {
    s.step = std::stoll(f.metadata.at("step"));
    s.sigma_rel = std::stod(f.metadata.at("sigma_rel"));
    s.gamma = std::stod(f.metadata.at("gamma"));
  } catch (const std::exception&) {
    throw UserError("post-hoc EMA snapshot " + file, "lacks its step / sigma_rel / gamma metadata",
                    "a snapshot written by moh train with train.phema");
  }
  return s;
}

}  // namespace

void write_snapshot(const std::string& run_dir, int64_t step, const std::vector<double>& sigma_rels,
                    const std::vector<TensorMap>& profiles) {
  const std::string root = run_dir + "/phema";
  fs::create_directories(root);
  AtomicDir dir(root + "/" + step_name(step), /*replace=*/true);
  for (size_t k = 0; k < sigma_rels.size(); ++k) {
    char sigma[32], gamma[32];
    std::snprintf(sigma, sizeof sigma, "%.17g", sigma_rels[k]);
    std::snprintf(gamma, sizeof gamma, "%.17g", gamma_of(sigma_rels[k]));
    save_safetensors(dir.path() + "/" + sigma_name(sigma_rels[k]), profiles.at(k),
                     {{"format", "pt"}, {"step", std::to_string(step)}, {"sigma_rel", sigma}, {"gamma", gamma}});
  }
  dir.commit();
}

std::vector<Snapshot> list_snapshots(const std::string& run_dir) {
  std::vector<Snapshot> out;
  const fs::path root = fs::path(run_dir) / "phema";
  if (fs::is_directory(root))
    for (const auto& step_dir : fs::directory_iterator(root)) {
      if (!step_dir.is_directory() || step_dir.path().filename().string().find('.') != std::string::npos) continue;
      for (const auto& f : fs::directory_iterator(step_dir.path()))
        if (f.path().extension() == ".safetensors") out.push_back(read_snapshot_header(f.path().string()));
    }
  if (out.empty())
    throw UserError(run_dir, "has no post-hoc EMA snapshots (no phema/STEP/*.safetensors)",
                    "train with train.phema: {sigma_rels: [0.05, 0.10], snapshot_every: N}");
  std::sort(out.begin(), out.end(), [](const Snapshot& a, const Snapshot& b) {
    return a.step != b.step ? a.step < b.step : a.sigma_rel < b.sigma_rel;
  });
  return out;
}

Reconstruction reconstruct(const std::string& run_dir, double sigma_rel, int64_t step) {
  const std::vector<Snapshot> all = list_snapshots(run_dir);
  Reconstruction r;
  r.sigma_rel = sigma_rel;
  r.gamma = gamma_of(sigma_rel, "--sigma-rel");
  const int64_t end = step > 0 ? step : all.back().step;
  for (const auto& s : all)
    if (s.step <= end) r.used.push_back(s), r.step = s.step;
  if (r.used.empty())
    throw UserError("--step " + std::to_string(step),
                    "is before the run's first snapshot (step " + std::to_string(all.front().step) + ")",
                    "choose a step at or after it");
  std::vector<Profile> profiles;
  for (const auto& s : r.used) profiles.push_back({static_cast<double>(s.step), s.gamma});
  r.coefficients = coefficients(profiles, {static_cast<double>(r.step), r.gamma});
  std::vector<TensorMap> maps;
  for (const auto& s : r.used) maps.push_back(load_safetensors(s.file).tensors);
  r.tensors = combine(maps, r.coefficients);
  return r;
}

void write_reconstruction(const Reconstruction& r, const std::string& run_dir, const std::string& out_dir) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    throw UserError("--out " + out_dir, "exists and is not empty", "choose a new directory");
  // Never a non-finite weights file (σ_rel's range keeps the arithmetic finite; the snapshots themselves may not be).
  for (const auto& [name, t] : r.tensors)
    if (t.is_floating_point() && !t.isfinite().all().item<bool>()) {
      std::ostringstream why;
      why << "post-hoc EMA of sigma_rel " << r.sigma_rel << " at step " << r.step << ": tensor " << name
          << " is not finite (the snapshots combined hold NaN or inf); nothing written to " << out_dir;
      throw RunStopped(why.str());
    }
  check_output_dir(out_dir, "--out " + out_dir);
  const std::string yaml = read_file(run_dir + "/config.resolved.yaml", "run config");
  TrainerState state;
  state.step = r.step;
  save_checkpoint(out_dir, state, r.tensors, {}, yaml, {}, r.tensors);
  nlohmann::json used = nlohmann::json::array();
  for (size_t i = 0; i < r.used.size(); ++i)
    used.push_back({{"step", r.used[i].step},
                    {"sigma_rel", r.used[i].sigma_rel},
                    {"gamma", r.used[i].gamma},
                    {"coefficient", r.coefficients[i]},
                    {"file", fs::relative(r.used[i].file, run_dir).string()}});
  const nlohmann::json j{
      {"run", run_dir}, {"sigma_rel", r.sigma_rel}, {"gamma", r.gamma}, {"step", r.step}, {"snapshots", used}};
  write_file_atomic(out_dir + "/phema_reconstruction.json", j.dump(1) + "\n");
}

RunProfiles::RunProfiles(const PhemaConfig& cfg, const torch::nn::Module& model) : cfg_(cfg) {
  for (const auto& [name, t] : module_tensor_views(model)) {
    if (t.is_floating_point())
      names_.push_back(name), live_.push_back(t);
    else
      fixed_.emplace(name, t);
  }
  std::vector<double> gammas;
  for (double s : cfg.sigma_rels) gammas.push_back(gamma_of(s, "train.phema.sigma_rels"));
  tracker_ = std::make_unique<Tracker>(live_, std::move(gammas));
}

namespace {
std::string checkpoint_name(double sigma_rel) {
  char name[48];
  std::snprintf(name, sizeof name, "phema_%.6g", sigma_rel);
  return name;
}
}  // namespace

void RunProfiles::load(const std::string& checkpoint_dir) {
  for (size_t k = 0; k < cfg_.sigma_rels.size(); ++k) {
    const std::string file = checkpoint_dir + "/" + checkpoint_name(cfg_.sigma_rels[k]) + ".safetensors";
    if (!fs::exists(file))
      throw UserError("--resume " + checkpoint_dir,
                      "holds no post-hoc EMA profile for sigma_rel " + std::to_string(cfg_.sigma_rels[k]),
                      "resume with the train.phema.sigma_rels the run was started with");
    const TensorMap loaded = load_safetensors(file).tensors;
    at::NoGradGuard ng;
    for (size_t i = 0; i < names_.size(); ++i) {
      const auto it = loaded.find(names_[i]);
      if (it == loaded.end() || !it->second.sizes().equals(live_[i].sizes()))
        throw UserError(file, "tensor " + names_[i] + " is missing or has another shape", "the checkpoint is damaged");
      tracker_->profile(k)[i].copy_(it->second);
    }
  }
}

TensorMap RunProfiles::profile_map(size_t k) const {
  TensorMap m = fixed_;
  for (size_t i = 0; i < names_.size(); ++i) m.emplace(names_[i], tracker_->profile(k)[i]);
  return m;
}

std::vector<std::pair<std::string, TensorMap>> RunProfiles::checkpoint_files() const {
  std::vector<std::pair<std::string, TensorMap>> files;
  for (size_t k = 0; k < cfg_.sigma_rels.size(); ++k)
    files.emplace_back(checkpoint_name(cfg_.sigma_rels[k]), profile_map(k));
  return files;
}

void RunProfiles::write(const std::string& run_dir, int64_t step) const {
  std::vector<TensorMap> maps;
  for (size_t k = 0; k < cfg_.sigma_rels.size(); ++k) maps.push_back(profile_map(k));
  write_snapshot(run_dir, step, cfg_.sigma_rels, maps);
}

}  // namespace moh::phema
