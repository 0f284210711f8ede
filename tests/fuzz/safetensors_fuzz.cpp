// libFuzzer target: SafetensorsFile::parse on arbitrary bytes, then every byte of every tensor.
// An mxq::Error is the expected answer to a bad file; anything else (a crash, a sanitizer report,
// another exception, a broken invariant) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mxq/io/safetensors.h"

namespace {

void require(bool invariant) {
  if (!invariant) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto file = mxq::io::SafetensorsFile::parse(image, "fuzz");
    std::size_t checksum = 0;
    for (const auto& [key, value] : file.metadata()) checksum += key.size() + value.size();
    std::size_t previous_end = 0;
    for (const auto& entry : file.entries()) {
      const std::span<const std::byte> bytes = file.bytes(entry.name);
      require(entry.begin <= entry.end && bytes.size() == entry.end - entry.begin);
      require(bytes.size() ==
              static_cast<std::size_t>(entry.shape.numel()) * mxq::size_of(entry.dtype));
      require(bytes.data() >= image.data() && bytes.data() + bytes.size() <= image.data() + size);
      if (!bytes.empty()) {
        require(entry.begin >= previous_end);  // entries come sorted and disjoint
        previous_end = entry.end;
      }
      for (const std::byte b : bytes) checksum += std::to_integer<unsigned>(b);
      const mxq::TensorView view = file.view(entry.name);
      require(view.shape() == entry.shape && view.dtype() == entry.dtype);
      require(view.nbytes() == bytes.size() && view.bytes() == bytes.data());
      for (std::size_t i = 0; i < view.nbytes(); ++i)
        checksum += std::to_integer<unsigned>(view.bytes()[i]);
      const auto address = reinterpret_cast<std::uintptr_t>(view.data());
      require(file.is_aligned(entry.name) == (address % mxq::size_of(entry.dtype) == 0));
    }
    // Keeps the reads from being optimized away.
    volatile std::size_t sink = checksum;
    (void)sink;
  } catch (const mxq::Error&) {
  }
  return 0;
}
