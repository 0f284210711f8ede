// Private helpers shared by the file readers and writers in src/io.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mxq/core/dtype.h"
#include "mxq/core/shape.h"

namespace mxq::io::detail {

// A whole file mapped read-only (POSIX mmap, MAP_PRIVATE). Pages are read from disk only when
// touched, so a reader that looks at one tensor reads only that tensor's pages. A file of size 0
// has an empty span and no mapping. The file must not be truncated while mapped (the kernel
// would raise SIGBUS on access to the missing pages; no user-space check can prevent that).
class MappedFile {
 public:
  // `what` names the kind of file in error messages ("safetensors file"). Throws kIo.
  static std::shared_ptr<const MappedFile> open(const std::string& path, std::string_view what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile(const std::byte* data, std::size_t size) : data_(data), size_(size) {}
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Writes the concatenation of `pieces` to `path` atomically, the one atomic writer of mxq (npy and
// safetensors files, the autotune cache, the rendezvous files): a temporary file in the same
// directory (".<name>.tmp-<pid>-<n>-<random>"), fsync, rename over `path`, fsync of the directory.
// Readers see the old file or the whole new one, also after a crash or a kill at any point.
// Permissions are those the file would have if it were written in place: a new file gets 0666 &
// ~umask, as any file a program creates; a file that is replaced keeps its permission bits (a
// cache a team made group-writable stays so, a private one stays private). `what` names the kind
// of file in error messages ("npy file"). On any error the temporary file is removed, `path` is
// left as it was, and kIo is thrown.
void write_file_atomically(const std::string& path,
                           std::span<const std::span<const std::byte>> pieces,
                           std::string_view what);
void write_file_atomically(const std::string& path, std::string_view text, std::string_view what);

// Removes the temporary files that write_file_atomically(path, ...) leaves behind when its process
// dies mid-write. Only safe while no other process writes `path`: the caller holds a lock that
// every writer of `path` takes (the autotune cache's lock).
void remove_stale_temporaries(const std::string& path);

// Bytes of a dense array of `shape` and `dtype`, or nullopt when the non-zero extents and the
// element size multiply to more than 2^63 - 1. Such a shape is refused even when it holds no
// element (a zero extent): its strides and partial products would overflow (numpy refuses it too).
std::optional<std::uint64_t> dense_nbytes(const Shape& shape, DType dtype);

// `text` quoted for an error message: non-printable bytes as \xNN, cut after `limit` bytes.
std::string printable(std::string_view text, std::size_t limit = 64);

}  // namespace mxq::io::detail
