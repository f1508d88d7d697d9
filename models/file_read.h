// Reading the first bytes of a model file without touching the rest: the header readers
// (safetensors.h, gguf.h) parse from a memory prefix plus the file's size, so the same parser
// runs on a real file, on a test's sparse file with a 24 GB hole, and on a fuzzer's buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vf {

// An open regular file (not a directory, FIFO or device: reading one of those could block or
// never end). Errors are InputError(path, ...) so a bad path is exit 2.
class HeaderFile {
 public:
  explicit HeaderFile(const std::string& path);
  ~HeaderFile();
  HeaderFile(const HeaderFile&) = delete;
  HeaderFile& operator=(const HeaderFile&) = delete;

  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The bytes [0, n) of the file (n is clamped to the file size).
  std::vector<std::uint8_t> prefix(std::uint64_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// "byte 1234: message" -- the way every header error names its place in the file.
std::string at_byte(std::uint64_t offset, const std::string& message);

}  // namespace vf
