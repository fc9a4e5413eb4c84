#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"

namespace kiln::io {

RegularFile::RegularFile(const std::string& path, const std::string& prefix,
                         const std::string& label) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail<IoError>("{} cannot open {}: {}", prefix, label, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail<IoError>("{} {} is not a regular file", prefix, label);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

size_t RegularFile::read_at(void* dst, size_t n, uint64_t offset) const {
  size_t done = 0;
  errno = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd_, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

}  // namespace kiln::io
