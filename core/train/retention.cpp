#include "core/train/retention.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>

namespace moh {

namespace fs = std::filesystem;

std::vector<int64_t> checkpoints_to_prune(std::vector<int64_t> steps, int64_t latest, int64_t best, int64_t keep_last,
                                          int64_t keep_every_steps) {
  if (keep_last <= 0) return {};
  std::sort(steps.begin(), steps.end());
  std::set<int64_t> keep{latest, best};
  for (size_t i = steps.size() > static_cast<size_t>(keep_last) ? steps.size() - keep_last : 0; i < steps.size(); ++i)
    keep.insert(steps[i]);
  std::vector<int64_t> out;
  for (int64_t s : steps)
    if (!keep.count(s) && !(keep_every_steps > 0 && s % keep_every_steps == 0)) out.push_back(s);
  return out;  // oldest first
}

namespace {

// The step named by checkpoints/<pointer> ("0001234"), or −1.
int64_t pointed_step(const fs::path& root, const char* pointer) {
  std::ifstream in(root / pointer);
  std::string name;
  if (!(in >> name) || name.empty() || name.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(name);
}

// Removes a checkpoint directory unless a reader holds it (an exclusive lock that cannot be had right now).
bool remove_unless_held(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  if (free) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  ::close(fd);
  return free;
}

}  // namespace

std::vector<std::string> prune_checkpoints(const std::string& run_dir, int64_t keep_last, int64_t keep_every_steps) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (keep_last <= 0 || !fs::is_directory(root)) return {};
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && !n.empty() && n.find_first_not_of("0123456789") == std::string::npos)
      steps.push_back(std::stoll(n));
  }
  std::vector<std::string> removed;
  for (int64_t s : checkpoints_to_prune(steps, pointed_step(root, "latest"), pointed_step(root, "best"), keep_last,
                                        keep_every_steps)) {
    char name[32];
    std::snprintf(name, sizeof name, "%07lld", static_cast<long long>(s));
    if (remove_unless_held(root / name))
      removed.push_back((root / name).string());
    else
      std::cerr << "note: checkpoint " << (root / name).string()
                << " kept for now: another process (moh sample / eval) is reading it\n";
  }
  return removed;
}

void hold_checkpoint(const std::string& checkpoint_dir) {
  static std::mutex mu;
  static std::vector<int> held;  // open for the rest of the process: the lock goes with the process
  const int fd = ::open(checkpoint_dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    ::close(fd);
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  held.push_back(fd);
}

int64_t free_bytes(const std::string& dir) {
  fs::path p = fs::absolute(dir);
  while (!p.empty() && !fs::exists(p)) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return INT64_MAX;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

std::string disk_room_problem(const std::string& dir, int64_t bytes) {
  const int64_t margin = std::max<int64_t>(64ll << 20, bytes / 50), have = free_bytes(dir);
  if (have >= bytes + margin) return "";
  auto mib = [](int64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; };
  return "a checkpoint needs " + mib(bytes + margin) + " (with a margin) and " + dir + " has " + mib(have) + " free";
}

}  // namespace moh
