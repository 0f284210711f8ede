// `mxq quantize mxfp4|fp8-block` (filled in once the formats module lands).
#include "commands.h"

namespace mxq::cli {
void register_quantize(CLI::App& /*app*/) {}
}  // namespace mxq::cli
