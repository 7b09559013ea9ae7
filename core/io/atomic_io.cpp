#include "core/io/atomic_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace moh {

namespace fs = std::filesystem;

static std::string unique_suffix() {
  static std::atomic<int> counter{0};
  return ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

void check_regular_file(const std::string& path, const std::string& what, const std::string& hint) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_regular_file(st)) return;
  std::string why = "not a regular file (a named pipe, a socket or a device)";
  if (st.type() == fs::file_type::not_found || ec == std::errc::no_such_file_or_directory)
    why = fs::is_symlink(fs::symlink_status(path, ec)) ? "a broken symbolic link" : "no such file";
  else if (ec == std::errc::too_many_symbolic_link_levels)
    why = "a symbolic link loop";
  else if (ec)
    why = ec.message();
  else if (fs::is_directory(st))
    why = "a directory, not a file";
  throw UserError(what + " " + path, why, hint);
}

std::string read_file(const std::string& path, const std::string& what) {
  check_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(what + " " + path, std::strerror(errno), "check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_output_dir(const std::string& dir, const std::string& what) {
  if (dir.empty()) throw UserError(what, "is empty", "give a directory");
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec);
  if (ec) throw UserError(what, ec.message(), "check the path");
  // The nearest ancestor that exists (the directory itself if it does).
  fs::path existing = p;
  while (!existing.empty()) {
    const fs::file_status st = fs::status(existing, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
      const std::string why =
          ec == std::errc::too_many_symbolic_link_levels ? "a symbolic link loop at " + existing.string()
          : ec == std::errc::not_a_directory             ? existing.string() + " lies under a file, not a directory"
                                                         : existing.string() + ": " + ec.message();
      throw UserError(what, why, "choose another path");
    }
    if (fs::exists(st)) {
      if (!fs::is_directory(st))
        throw UserError(what, existing.string() + " is a file, not a directory", "choose another path");
      break;
    }
    if (existing == existing.root_path()) break;
    existing = existing.parent_path();
  }
  // Probe by creating (and removing) a directory there: permission bits say nothing for root, read-only mounts or
  // pseudo filesystems such as /proc.
  std::string probe = (existing / ".moh-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr)
    throw UserError(what, "cannot create anything in " + existing.string() + ": " + std::strerror(errno),
                    "choose a writable path");
  ::rmdir(probe.c_str());
}

void check_output_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw UserError(what, "is empty", "give a file path");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError(what, "is a directory", "give a file path");
  fs::path parent = fs::absolute(fs::path(path), ec).parent_path();
  check_output_dir(parent.string(), what);
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

static std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + unique_suffix()) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot create " + tmp_ + ": " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot write " + tmp_ + ": " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  const bool synced = ::fsync(fd_) == 0;
  const int e = errno;
  ::close(fd_);
  fd_ = -1;
  if (!synced && e != EINVAL) {
    ::unlink(tmp_.c_str());
    throw std::runtime_error("cannot write " + tmp_ + ": " + std::strerror(e));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int re = errno;
    ::unlink(tmp_.c_str());
    throw std::runtime_error("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(re));
  }
  fsync_path(parent_of(path_));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

AtomicDir::AtomicDir(std::string final_path, bool replace) : final_(std::move(final_path)), replace_(replace) {
  while (!final_.empty() && final_.back() == '/') final_.pop_back();
  tmp_ = final_ + unique_suffix();
  fs::create_directories(tmp_);
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void AtomicDir::commit() {
  for (const auto& e : fs::recursive_directory_iterator(tmp_))
    if (e.is_regular_file()) fsync_path(e.path().string());
  fsync_path(tmp_);
  std::string old;
  if (fs::exists(final_)) {
    if (!replace_) throw std::runtime_error("refusing to overwrite existing " + final_);
    old = final_ + ".old" + unique_suffix();
    fs::rename(final_, old);
  }
  fs::rename(tmp_, final_);
  committed_ = true;
  fsync_path(parent_of(final_));
  if (!old.empty()) fs::remove_all(old);
}

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) fs::remove_all(e.path(), ec);
}

}  // namespace moh
