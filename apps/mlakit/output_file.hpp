// A file the command writes its results to, named by a flag (--json, --csv): opened (created or
// truncated) before the work starts, so that an unwritable path fails at once rather than after
// the run, and closed with every write checked (a full disk fails the command, exit 2).
#pragma once

#include <fstream>
#include <string>

namespace mlakit::cli {

class OutputFile {
 public:
  OutputFile() = default;
  // Throws mlakit::Error(kInvalidArgument) "<flag> <path>: cannot open for writing: <reason>".
  OutputFile(std::string flag, std::string path);

  bool is_open() const { return stream_.is_open(); }
  std::ostream& stream() { return stream_; }
  // Flushes and closes; throws mlakit::Error(kBackend) "<flag> <path>: write failed: <reason>"
  // when a write or the close failed.
  void close();

 private:
  std::string flag_, path_;
  std::ofstream stream_;
};

// Flushes stdout (C++ and C streams); throws mlakit::Error(kBackend) "cannot write to stdout:
// <reason>" when a write failed (e.g. `> /dev/full`).
void flush_stdout();

}  // namespace mlakit::cli
