#pragma once
// What a long run keeps on disk (train.keep_last, train.keep_every_steps): a DiT-XL/2 training checkpoint is 10.8 GB,
// so 1,400 epochs of one per epoch would be 15 TB. After a new checkpoint is committed (and `latest` moved onto it),
// the older ones that neither the newest N, the milestones nor `best` keep are deleted, oldest first; a checkpoint a
// running `moh sample` / `moh eval` holds (a shared lock on its directory) is left for a later pass. Before each save
// the free space is checked against the checkpoint's size, so a full disk stops the run with everything already on
// disk intact instead of in the middle of a write.
#include <cstdint>
#include <string>
#include <vector>

namespace moh {

/// The step directories of run_dir/checkpoints to delete under the rules (pure: tests give it any listing). `steps`
/// are the directories present; `latest` and `best` (−1 = none) are always kept.
std::vector<int64_t> checkpoints_to_prune(std::vector<int64_t> steps, int64_t latest, int64_t best, int64_t keep_last,
                                          int64_t keep_every_steps);

/// Applies the rules to run_dir/checkpoints (keep_last 0 = keep every checkpoint). Returns the directories removed;
/// one held by a reader is skipped with a note on stderr.
std::vector<std::string> prune_checkpoints(const std::string& run_dir, int64_t keep_last, int64_t keep_every_steps);

/// A shared lock on a checkpoint directory for the rest of the process (moh sample / eval read from it for hours):
/// pruning does not delete it meanwhile.
void hold_checkpoint(const std::string& checkpoint_dir);

/// Free bytes on the file system of `dir` (its nearest existing ancestor).
int64_t free_bytes(const std::string& dir);

/// "" when `dir` has room for `bytes` more (plus a margin of 2 %, at least 64 MiB), else the one-line reason.
std::string disk_room_problem(const std::string& dir, int64_t bytes);

}  // namespace moh
