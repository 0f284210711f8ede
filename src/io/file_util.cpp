#include "io/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/unique_fd.h"
#include "mxq/core/error.h"

namespace mxq::io::detail {
namespace {

using mxq::detail::UniqueFd;

std::string errno_text(int error) { return std::strerror(error); }

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

// Temporary files of `path` start with this: hidden, in the destination's directory.
std::string temporary_prefix(const std::string& path) {
  std::string prefix = ".";  // (built by appending: GCC 12 warns wrongly on "." + string)
  prefix += base_name_of(path);
  prefix += ".tmp-";
  return prefix;
}

// A name in the destination's directory that no other writer (thread or process) picks.
std::string temporary_name_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  std::random_device entropy;
  const std::string dir = directory_of(path);
  return (dir == "/" ? std::string("/") : dir + "/") + temporary_prefix(path) +
         std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         std::to_string(entropy());
}

// Gives the temporary file the permission bits of the file it replaces, if there is one (a new
// file keeps the 0666 & ~umask it was created with).
void keep_permissions(int fd, const std::string& path, std::string_view what) {
  struct stat existing {};
  if (::stat(path.c_str(), &existing) != 0 || !S_ISREG(existing.st_mode)) return;
  if (::fchmod(fd, existing.st_mode & 0777) != 0)
    fail(ErrorCode::kIo, what, " '", path, "': cannot give the new version the permissions of the ",
         "old one: ", errno_text(errno));
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
  UniqueFd file(fd);
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
  UniqueFd file(fd);
  try {
    for (const auto& piece : pieces) write_all(file.get(), piece, path, what);
    keep_permissions(file.get(), path, what);
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
  const UniqueFd dir(::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.valid()) ::fsync(dir.get());
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(text.data(), text.size()));
  write_file_atomically(path, std::span(&piece, 1), what);
}

void remove_stale_temporaries(const std::string& path) {
  const std::string dir = directory_of(path);
  const std::string prefix = temporary_prefix(path);
  std::vector<std::string> stale;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(d)) {
      if (std::string_view(entry->d_name).starts_with(prefix)) stale.emplace_back(entry->d_name);
    }
    ::closedir(d);
  }
  for (const std::string& name : stale) ::unlink((dir + "/" + name).c_str());
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
