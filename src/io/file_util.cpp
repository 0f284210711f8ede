#include "io/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>

#include "mxq/core/error.h"

namespace mxq::io::detail {
namespace {

std::string errno_text(int error) { return std::strerror(error); }

// Closes a descriptor on scope exit unless released.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  [[nodiscard]] int get() const { return fd_; }
  // Closes now and reports close()'s error (a delayed write error can surface only here).
  int close_checked() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A name in the destination's directory that no other writer (thread or process) picks.
std::string temporary_name_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  std::random_device entropy;
  const std::string dir = directory_of(path);
  return (dir == "/" ? std::string("/") : dir + "/") + "." + base_name_of(path) + ".tmp-" +
         std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         std::to_string(entropy());
}

void write_all(int fd, std::span<const std::byte> piece, const std::string& path,
               std::string_view what) {
  while (!piece.empty()) {
    const ssize_t written = ::write(fd, piece.data(), piece.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, what, " '", path, "': write failed: ", errno_text(errno));
    }
    piece = piece.subspan(static_cast<std::size_t>(written));
  }
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path, std::string_view what) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(ErrorCode::kIo, what, " '", path, "': cannot open: ", errno_text(errno));
  FileDescriptor file(fd);
  struct stat status {};
  if (::fstat(file.get(), &status) != 0)
    fail(ErrorCode::kIo, what, " '", path, "': cannot stat: ", errno_text(errno));
  if (!S_ISREG(status.st_mode))
    fail(ErrorCode::kIo, what, " '", path, "': expected a regular file, found ",
         S_ISDIR(status.st_mode) ? "a directory" : "a special file");
  const auto size = static_cast<std::size_t>(status.st_size);
  if (size == 0) return std::shared_ptr<const MappedFile>(new MappedFile(nullptr, 0));
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.get(), 0);
  if (data == MAP_FAILED)
    fail(ErrorCode::kIo, what, " '", path, "': cannot map ", size, " bytes: ", errno_text(errno));
  // The mapping stays valid after the descriptor is closed.
  return std::shared_ptr<const MappedFile>(
      new MappedFile(static_cast<const std::byte*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void write_file_atomically(const std::string& path,
                           std::span<const std::span<const std::byte>> pieces,
                           std::string_view what) {
  if (path.empty())
    fail(ErrorCode::kInvalidArgument, what, " path: expected a file name, found ''");
  std::string temporary;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    temporary = temporary_name_for(path);
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST && errno != EINTR) break;
  }
  if (fd < 0)
    fail(ErrorCode::kIo, what, " '", path, "': cannot create a temporary file in '",
         directory_of(path), "': ", errno_text(errno));
  FileDescriptor file(fd);
  try {
    for (const auto& piece : pieces) write_all(file.get(), piece, path, what);
    if (::fsync(file.get()) != 0)
      fail(ErrorCode::kIo, what, " '", path, "': fsync failed: ", errno_text(errno));
    if (const int error = file.close_checked(); error != 0)
      fail(ErrorCode::kIo, what, " '", path, "': close failed: ", errno_text(error));
    if (::rename(temporary.c_str(), path.c_str()) != 0)
      fail(ErrorCode::kIo, what, " '", path,
           "': cannot rename the temporary file over it: ", errno_text(errno));
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  // Makes the rename durable. The file is complete and in place already, so a failure here is
  // not reported: the caller's data is written, only its survival of a power loss is less sure.
  const int dir_fd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

std::optional<std::uint64_t> dense_nbytes(const Shape& shape, DType dtype) {
  constexpr auto kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t nonzero_product = size_of(dtype);
  bool empty = false;
  for (const std::int64_t extent : shape.dims()) {
    if (extent == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero_product, static_cast<std::uint64_t>(extent),
                               &nonzero_product) ||
        nonzero_product > kLimit)
      return std::nullopt;
  }
  return empty ? 0 : nonzero_product;
}

std::string printable(std::string_view text, std::size_t limit) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  out += text.size() > limit ? "'..." : "'";
  return out;
}

}  // namespace mxq::io::detail
