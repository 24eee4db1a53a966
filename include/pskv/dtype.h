// DType: the element types of arrays (MXNet's dtype codes), their names and sizes,
// and the 16-bit float conversions. Its own header so that code about element types
// needs no arrays (pskv/ndarray.h includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pskv {

/// Element types. The numeric codes are MXNet's dtype codes (used on the wire).
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kUInt8 = 3,
  kInt32 = 4,
  kInt8 = 5,
  kInt64 = 6,
  kBFloat16 = 12,
};

/// Size in bytes of one element; throws InvalidArgument for an unknown code.
size_t DTypeSize(DType t);
/// "float32", "float16", ...
std::string DTypeName(DType t);
/// Parses "float32"/"fp32"/"float" etc.; throws InvalidArgument listing valid names.
DType ParseDType(const std::string& name);
/// True for the code of a supported dtype (used to validate wire input).
bool IsValidDType(int code);
/// True for float16 and bfloat16.
bool IsLowPrecision(DType t);

/// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBFloat16(float f);

}  // namespace pskv
