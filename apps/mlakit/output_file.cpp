#include "output_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <utility>

#include "mlakit/error.hpp"

namespace mlakit::cli {

namespace {

std::string reason(int error) { return error != 0 ? std::strerror(error) : "I/O error"; }

}  // namespace

OutputFile::OutputFile(std::string flag, std::string path)
    : flag_(std::move(flag)), path_(std::move(path)) {
  errno = 0;
  stream_.open(path_);
  if (!stream_.is_open()) {
    throw Error(ErrorCode::kInvalidArgument,
                flag_ + " " + path_ + ": cannot open for writing: " + reason(errno));
  }
}

void OutputFile::close() {
  if (!stream_.is_open()) return;
  errno = 0;
  stream_.flush();
  const bool flushed = static_cast<bool>(stream_);
  const int flush_error = errno;
  stream_.close();
  if (!flushed || stream_.fail()) {
    throw Error(ErrorCode::kBackend, flag_ + " " + path_ + ": write failed: " +
                                         reason(flush_error ? flush_error : errno));
  }
}

void flush_stdout() {
  errno = 0;
  std::cout.flush();
  const bool ok = static_cast<bool>(std::cout) && std::fflush(stdout) == 0 && !std::ferror(stdout);
  if (!ok) throw Error(ErrorCode::kBackend, "cannot write to stdout: " + reason(errno));
}

}  // namespace mlakit::cli
