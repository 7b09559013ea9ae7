// moh_zygote: the `moh` program (apps/main.cpp) for tests that start it hundreds of times. Every start of `moh`
// loads LibTorch and registers its operators before main (Debian's LibTorch 1.13 brings 286 libraries: ~0.8 s of a
// refused config's 0.85 s); the zygote does that once and runs each request in a forked child, which begins where a
// fresh `moh` process begins: at main, with nothing of the program run yet.
//
//   moh_zygote --serve DIR   serve requests through the FIFOs DIR/req and DIR/rc until DIR/req gets an empty one
//   moh_zygote ARGS...       exactly `moh ARGS...` (what a child re-executing /proc/self/exe runs)
//
// A request is written to DIR/req as NUL-terminated fields: the working directory, the stdout and stderr files, a
// time limit in seconds, argc, argv (argv[0] as the program the user typed), then the environment. The exit code
// comes back on DIR/rc as one line (128 + N for a child ended by signal N). An environment variable that the
// libraries read while they load (OMP_*, OPENBLAS_*, LD_*, ...) is the zygote's own in a fork: a request that sets one
// differently is run by executing the program afresh in the child.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace moh::apps {
int program_main(int argc, char** argv);  // apps/commands.h
}

namespace {

// The threads of this process: a fork copies only the calling one, and a lock another held stays held in the child.
size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The whole content written to the FIFO by one writer (empty when a writer closed without writing).
std::string read_request(const std::string& fifo) {
  const int fd = ::open(fifo.c_str(), O_RDONLY);
  if (fd < 0) return "";
  std::string data;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) data.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return data;
}

std::vector<std::string> split_fields(const std::string& data) {
  std::vector<std::string> fields;
  for (size_t b = 0, e; b < data.size(); b = e + 1) {
    e = data.find('\0', b);
    if (e == std::string::npos) e = data.size();
    fields.push_back(data.substr(b, e - b));
  }
  return fields;
}

// Variables read before main by LibTorch, OpenMP, OpenBLAS, MKL, the loader or the allocator.
bool read_at_load(const std::string& entry) {
  for (const char* prefix : {"OMP_", "GOMP_", "KMP_", "OPENBLAS_", "GOTO", "MKL_", "LD_", "MALLOC_", "GLIBC_", "TORCH_",
                             "PYTORCH_", "CUDA_", "ATEN_", "DNNL_", "ONEDNN_", "XNNPACK_"})
    if (entry.rfind(prefix, 0) == 0) return true;
  return false;
}

std::vector<std::string> load_time_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e)
    if (read_at_load(*e)) out.emplace_back(*e);
  std::sort(out.begin(), out.end());
  return out;
}

// In the child: the request's directory, files, time limit and environment, then the program. Never returns.
[[noreturn]] void run_child(std::vector<std::string> fields, const std::vector<std::string>& loaded_with) {
  const auto redirect = [](const std::string& path, int target, int flags) {
    const int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0 || ::dup2(fd, target) < 0) ::_exit(125);
    ::close(fd);
  };
  if (::chdir(fields[0].c_str()) != 0) ::_exit(125);
  redirect("/dev/null", 0, O_RDONLY);
  redirect(fields[1], 1, O_WRONLY | O_CREAT | O_TRUNC);
  redirect(fields[2], 2, O_WRONLY | O_CREAT | O_TRUNC);
  ::alarm(static_cast<unsigned>(std::strtoul(fields[3].c_str(), nullptr, 10)));
  const size_t argc = std::strtoul(fields[4].c_str(), nullptr, 10);
  if (argc < 1 || 5 + argc > fields.size()) ::_exit(125);
  std::vector<char*> argv;
  for (size_t i = 5; i < 5 + argc; ++i) argv.push_back(fields[i].data());
  argv.push_back(nullptr);
  ::clearenv();
  for (size_t i = 5 + argc; i < fields.size(); ++i) ::putenv(fields[i].data());
  if (load_time_environment() != loaded_with) {
    ::execv("/proc/self/exe", argv.data());
    ::_exit(125);
  }
  const int code = moh::apps::program_main(static_cast<int>(argc), argv.data());
  std::cout.flush(), std::cerr.flush(), std::clog.flush(), std::fflush(nullptr);  // as apps/moh.cpp ends
  std::_Exit(code);
}

int exit_code_of(pid_t child) {
  int status = 0;
  while (::waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return 125;
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 125;
}

int serve(const std::string& dir) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the test script that started it ended: so does the zygote
  if (const size_t n = thread_count(); n != 1) {
    std::fprintf(stderr, "moh_zygote: %zu threads before any request: a fork would not be a fresh process\n", n);
    return 3;
  }
  const std::vector<std::string> loaded_with = load_time_environment();
  const std::string req = dir + "/req", rc = dir + "/rc";
  if (::mkfifo(req.c_str(), 0600) != 0 || ::mkfifo(rc.c_str(), 0600) != 0) {
    std::perror("moh_zygote: mkfifo");
    return 3;
  }
  for (;;) {
    std::vector<std::string> fields = split_fields(read_request(req));
    if (fields.empty()) return 0;
    int code = 125;
    if (fields.size() >= 6) {
      std::fflush(nullptr);
      const pid_t child = ::fork();
      if (child == 0) run_child(std::move(fields), loaded_with);
      code = child < 0 ? 125 : exit_code_of(child);
    }
    const std::string line = std::to_string(code) + "\n";
    const int fd = ::open(rc.c_str(), O_WRONLY);
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 3;
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--serve") == 0) return serve(argv[2]);
  return moh::apps::program_main(argc, argv);
}
