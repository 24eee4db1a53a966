// DecodeImage of a build without libjpeg/libpng (CMake did not find them): the
// RecordIO framing still works; decoding says what to install.
#include <string>

#include "pskv/error.h"
#include "pskv/recordio.h"

namespace pskv::data {

bool HaveImageDecoder() {
  return false;
}

DecodedImage DecodeImage(const uint8_t*, size_t, int, const std::string& what) {
  throw UsageError(what +
                   ": this pskv was built without the JPEG/PNG decoder: install Debian's "
                   "libjpeg62-turbo-dev and libpng-dev (scripts/install-deps.sh), then "
                   "configure and build again");
}

}  // namespace pskv::data
