#pragma once
// Crash-safe writes: files and directories appear under their final name only when complete
// (temporary name in the same directory, fsync, rename, fsync of the parent). A process killed mid-way leaves the
// previous content untouched.
#include <string>

namespace moh {

/// Reads a whole file; throws UserError if it cannot be opened.
std::string read_file(const std::string& path, const std::string& what = "file");

/// UserError(what + " " + path, why, hint) unless `path` is a regular file (symbolic links followed): missing, a
/// broken link, a directory, or a named pipe, socket or device, which an open for reading could wait on for ever.
/// Every reader of user files calls it before opening.
void check_regular_file(const std::string& path, const std::string& what, const std::string& hint = "check the path");

/// Writes `bytes` to `path` atomically, replacing any previous file only once the new one is on disk.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// A file written piece by piece under a temporary name and moved into place by commit() (fsync, rename, fsync of the
/// parent); destroyed before commit(), the temporary file is removed. For files too large to build in memory.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

/// fsync of a file or directory (best effort on filesystems that do not support it for directories).
void fsync_path(const std::string& path);

/// A directory built under a temporary name and renamed into place by commit(). If destroyed before commit() the
/// temporary directory is removed. With replace=true an existing final directory is swapped out after the new one
/// is complete.
class AtomicDir {
 public:
  explicit AtomicDir(std::string final_path, bool replace = false);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  /// The temporary directory to write into.
  const std::string& path() const { return tmp_; }
  /// fsyncs every file, renames into place, fsyncs the parent.
  void commit();

 private:
  std::string final_, tmp_;
  bool replace_, committed_ = false;
};

/// Checks, before any work, that `dir` can be created (or, if it exists, is a directory) and written to: every
/// existing ancestor is a directory and the nearest existing one is writable. Nothing is created. UserError naming
/// `what` (e.g. "--out samples") otherwise.
void check_output_dir(const std::string& dir, const std::string& what);
/// The same for a file to be written: its directory passes check_output_dir and the path is not a directory.
void check_output_file(const std::string& path, const std::string& what);

/// Removes leftovers of killed writers (`*.tmp-*` entries) in a directory.
void remove_stale_temporaries(const std::string& dir);

}  // namespace moh
