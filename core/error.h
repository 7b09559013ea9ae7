#pragma once
// User-facing errors. A UserError is a mistake in the user's input (config, CLI flag, file on disk): the app prints it
// as one line `error: <what>: <why> (<hint>)` and exits with code 2. Anything else that escapes is a runtime failure
// (exit code 1).
#include <stdexcept>
#include <string>
#include <vector>

namespace moh {

/// Exit codes shared by every `moh` subcommand.
constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUserError = 2;

/// A mistake in user input. `what` names the thing (a file, a key, a flag), `why` says what is wrong,
/// `hint` (optional) says how to fix it.
class UserError : public std::runtime_error {
 public:
  UserError(std::string what, std::string why, std::string hint = "");
  const std::string& reason() const { return why_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string what_, why_, hint_;
};

/// A runtime failure every rank of a run meets alike (a diverged run, a full disk): exit 1 with one line, said once
/// by each machine's first rank (as an input error is), not once per rank.
class RunStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Formats the single error line `error: <what>: <why> (<hint>)`.
std::string format_error_line(const std::string& what, const std::string& why, const std::string& hint);

/// Levenshtein edit distance (used for "did you mean" suggestions).
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `key` if it is close enough to be a plausible typo, else "".
std::string nearest_name(const std::string& key, const std::vector<std::string>& candidates);

/// Joins names with ", " (for "valid names are: ..." hints).
std::string join(const std::vector<std::string>& names, const std::string& sep = ", ");

}  // namespace moh
