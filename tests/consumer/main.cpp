// Uses a few public headers of an installed mxq and prints what it sees.
#include <cstdio>

#include "mxq/core/build_info.h"
#include "mxq/core/tensor.h"
#include "mxq/formats/bf16.h"

int main() {
  const mxq::Tensor t = mxq::Tensor::zeros(mxq::DType::kF32, {2, 3});
  std::printf("consumer: mxq %s, tensor %s, bf16(1.0)=0x%04x\n", mxq::build_info().version.c_str(),
              t.shape().str().c_str(), static_cast<unsigned>(mxq::float_to_bf16(1.0F)));
  return t.numel() == 6 ? 0 : 1;
}
