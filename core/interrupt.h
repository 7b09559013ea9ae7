#pragma once
// Safe stop of a training run: while a StopOnSignal is alive, the first SIGINT (Ctrl-C) or SIGTERM (a scheduler's
// stop) only records the request, which the training loop honours at its next step boundary by writing a checkpoint;
// a second one exits at once (code 128 + signal) and leaves the last complete checkpoint as it is.

namespace moh {

class StopOnSignal {
 public:
  /// Installs the handlers; `quiet` (data-parallel ranks other than 0) prints nothing on a signal.
  explicit StopOnSignal(bool quiet = false);
  /// Restores the previous handlers.
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  /// The signal that asked to stop (SIGINT, SIGTERM), 0 if none arrived.
  static int requested();
  /// Records a stop request as if `sig` had arrived (tests), or clears it (sig = 0).
  static void request(int sig);
};

}  // namespace moh
