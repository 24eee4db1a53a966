// JPEG (libjpeg) and PNG (libpng's simplified API) decoding for the RecordIO
// reader; built when CMake finds both libraries, else image_decode_stub.cc.
#include <cstring>
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/recordio.h"

#include <jpeglib.h>
#include <png.h>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE

namespace pskv::data {

namespace {

bool IsJpeg(const uint8_t* p, size_t n) {
  return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
}
bool IsPng(const uint8_t* p, size_t n) {
  return n >= 8 && png_sig_cmp(p, 0, 8) == 0;
}

// libjpeg reports errors through error_exit, which must not return: it longjmps
// back to DecodeJpeg. Only C frames (libjpeg's) lie between, so no destructor is
// skipped; `out` belongs to the caller.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegQuiet(j_common_ptr, int) {}  // warnings (e.g. extraneous bytes) are not errors

// Returns false with `err->message` set on a libjpeg error.
bool DecodeJpeg(const uint8_t* data, size_t size, int channels, DecodedImage* out, JpegError* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = JpegErrorExit;
  err->mgr.emit_message = JpegQuiet;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->rows = static_cast<int>(cinfo.output_height);
  out->cols = static_cast<int>(cinfo.output_width);
  out->channels = channels;
  const size_t stride = static_cast<size_t>(out->cols) * static_cast<size_t>(channels);
  out->pixels.resize(stride * static_cast<size_t>(out->rows));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

}  // namespace

bool HaveImageDecoder() {
  return true;
}

DecodedImage DecodeImage(const uint8_t* data, size_t size, int channels, const std::string& what) {
  if (channels != 1 && channels != 3)
    throw InvalidArgument("DecodeImage: channels must be 1 or 3, got " + std::to_string(channels));
  DecodedImage img;
  if (IsJpeg(data, size)) {
    JpegError err{};
    if (!DecodeJpeg(data, size, channels, &img, &err))
      throw IOError(what + ": cannot decode its JPEG image: " + err.message);
    return img;
  }
  if (IsPng(data, size)) {
    png_image png;
    std::memset(&png, 0, sizeof png);
    png.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&png, data, size))
      throw IOError(what + ": cannot decode its PNG image: " + png.message);
    png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;  // alpha composited away
    img.rows = static_cast<int>(png.height);
    img.cols = static_cast<int>(png.width);
    img.channels = channels;
    img.pixels.resize(PNG_IMAGE_SIZE(png));
    if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
      const std::string msg = png.message;
      png_image_free(&png);
      throw IOError(what + ": cannot decode its PNG image: " + msg);
    }
    return img;
  }
  throw IOError(what + ": the image is neither JPEG nor PNG (" + std::to_string(size) +
                " bytes; first bytes do not match either signature)");
}

}  // namespace pskv::data
