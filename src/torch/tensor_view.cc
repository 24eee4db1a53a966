// TensorView: torch tensors as NDArrays (include/pskv/torch.h).
#include <memory>
#include <string>

#include "pskv/error.h"
#include "pskv/torch.h"

namespace pskv {

namespace {
DType ToDType(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return DType::kFloat32;
    case torch::kDouble:
      return DType::kFloat64;
    case torch::kHalf:
      return DType::kFloat16;
    case torch::kBFloat16:
      return DType::kBFloat16;
    case torch::kInt:
      return DType::kInt32;
    case torch::kLong:
      return DType::kInt64;
    case torch::kChar:
      return DType::kInt8;
    case torch::kByte:
      return DType::kUInt8;
    default:
      throw InvalidArgument(std::string("unsupported tensor dtype ") +
                            c10::toString(t.scalar_type()));
  }
}
}  // namespace

NDArray TensorView(const torch::Tensor& t) {
  if (!t.device().is_cpu()) throw InvalidArgument("pskv on this build handles CPU tensors only");
  if (!t.is_contiguous())
    throw InvalidArgument("TensorView needs a contiguous tensor (call .contiguous())");
  Shape shape(t.sizes().begin(), t.sizes().end());
  auto keep = std::make_shared<torch::Tensor>(t);
  return NDArray::Wrap(t.data_ptr(), shape, ToDType(t), keep);
}

}  // namespace pskv
