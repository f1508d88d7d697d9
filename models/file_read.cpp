#include "models/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {

HeaderFile::HeaderFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw InputError(path, fmt::format("cannot open file: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw InputError(path, fmt::format("cannot stat file: {}", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError(path, S_ISDIR(st.st_mode) ? "is a directory, not a model file" : "is not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

HeaderFile::~HeaderFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::uint8_t> HeaderFile::prefix(std::uint64_t n) const {
  if (n > size_) n = size_;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out.data() + done, static_cast<std::size_t>(n - done), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw InputError(path_, at_byte(done, fmt::format("cannot read: {}", std::strerror(errno))));
    if (r == 0) throw InputError(path_, at_byte(done, "the file ended while reading (it changed size?)"));
    done += static_cast<std::uint64_t>(r);
  }
  return out;
}

std::string at_byte(std::uint64_t offset, const std::string& message) { return fmt::format("byte {}: {}", offset, message); }

}  // namespace vf
