// `mxq dequantize` (filled in once the formats module lands).
#include "commands.h"

namespace mxq::cli {
void register_dequantize(CLI::App& /*app*/) {}
}  // namespace mxq::cli
