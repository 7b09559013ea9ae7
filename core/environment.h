#pragma once
// The environment variables the toolkit reads, in one table: each with the values it takes (whole-text numbers with a
// range, a set of words, a path), checked once when a command starts, before any work: a value outside them is the
// one-line input error naming the variable, never a silent default. docs/ENVIRONMENT.md lists the same table
// (`moh info --environment` prints it; tests/bad_input_test.sh tries a bad value of each).
#include <optional>
#include <string>
#include <vector>

namespace moh {

/// What a variable takes.
enum class EnvKind {
  integer,  ///< a whole decimal integer in [min, max]
  number,   ///< a whole decimal number in [min, max]
  word,     ///< one of `words`
  text,     ///< any non-empty text (a path, a command prefix, a core name)
};

/// One variable: its name, what it takes, and what it does.
struct EnvSwitch {
  const char* name;
  EnvKind kind;
  double min = 0, max = 0;         ///< integer / number
  std::vector<std::string> words;  ///< word
  const char* meaning;             ///< one line for the documentation
  bool internal = false;           ///< set by moh for its own child processes, not by users
};

/// Every variable, in documentation order.
const std::vector<EnvSwitch>& env_switches();

/// Checks every variable of the table that is set; a UserError naming the first bad one (its value, what it takes).
/// The rank variables are checked together too: RANK < WORLD_SIZE, LOCAL_RANK < LOCAL_WORLD_SIZE.
void check_environment();

/// The value of a table variable, checked (UserError as check_environment), or nullopt when it is unset.
std::optional<double> env_number(const char* name);
std::optional<std::string> env_word(const char* name);

/// The Markdown table of env_switches() (docs/ENVIRONMENT.md, `moh info --environment`).
std::string environment_markdown();

}  // namespace moh
