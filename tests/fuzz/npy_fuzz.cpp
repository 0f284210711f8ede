// libFuzzer target: parse_npy on arbitrary bytes, then every byte of the array. An mxq::Error is
// the expected answer to a bad file; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "mxq/io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const mxq::Tensor tensor =
        mxq::io::parse_npy({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
    if (tensor.nbytes() > size || !tensor.view().is_contiguous()) __builtin_trap();
    std::size_t checksum = 0;
    for (std::size_t i = 0; i < tensor.nbytes(); ++i)
      checksum += std::to_integer<unsigned>(tensor.view().bytes()[i]);
    // The array bytes are the file's last bytes, copied unchanged.
    for (std::size_t i = 0; i < tensor.nbytes(); ++i)
      if (tensor.view().bytes()[i] != static_cast<std::byte>(data[size - tensor.nbytes() + i]))
        __builtin_trap();
    volatile std::size_t sink = checksum;
    (void)sink;
  } catch (const mxq::Error&) {
  }
  return 0;
}
