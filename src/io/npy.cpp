// NumPy .npy: magic "\x93NUMPY", major and minor version bytes, a little-endian header length
// (2 bytes in version 1.0, 4 bytes in 2.0 and 3.0), a Python dict literal with the keys descr,
// fortran_order and shape, then the raw array bytes. The writer reproduces numpy.save's bytes.
#include "mxq/io/npy.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

#include "io/file_util.h"

namespace mxq::io {
namespace {

using detail::printable;

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kArrayAlign = 64;           // numpy pads the header to this multiple
constexpr std::size_t kGrowthAxisMaxDigits = 21;  // numpy's spare room for the first extent
constexpr std::string_view kSupportedDescrs = "'<f4', '<f2', '<i4', '<i8', '|u1'";

struct DescrSpelling {
  std::string_view descr;
  DType dtype;
};
// The first spelling of each dtype is the one the writer uses (numpy's own).
constexpr std::array<DescrSpelling, 6> kDescrs = {{
    {"<f4", DType::kF32},
    {"<f2", DType::kF16},
    {"<i4", DType::kI32},
    {"<i8", DType::kI64},
    {"|u1", DType::kU8},
    {"<u1", DType::kU8},
}};

struct NpyHeader {
  DType dtype = DType::kF32;
  Shape shape;
};

// A strict reader of the one dict literal numpy writes, tolerant of whitespace anywhere Python
// allows it and of either quote character.
class HeaderDictParser {
 public:
  HeaderDictParser(std::string_view label, std::string_view text) : label_(label), text_(text) {}

  NpyHeader parse() {
    expect('{', "'{' opening the header dict");
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<Shape> shape;
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string("a printable key or '}'");
      skip_space();
      expect(':', "':' after the key " + printable(key));
      skip_space();
      if (key == "descr") {
        if (descr) error("the key 'descr' appears twice");
        if (peek() == '[')
          error("descr: structured dtypes are not supported; expected one of ", kSupportedDescrs);
        descr = parse_string("a printable descr such as '<f4'");
      } else if (key == "fortran_order") {
        if (fortran_order) error("the key 'fortran_order' appears twice");
        fortran_order = parse_bool();
      } else if (key == "shape") {
        if (shape) error("the key 'shape' appears twice");
        shape = parse_shape();
      } else {
        error("unexpected key ", printable(key), " (expected descr, fortran_order and shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') error_found("',' or '}' after the value of " + printable(key));
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) error_found("only spaces and a newline after the header dict");
    if (!descr) error("the header dict has no 'descr' key");
    if (!fortran_order) error("the header dict has no 'fortran_order' key");
    if (!shape) error("the header dict has no 'shape' key");
    if (*fortran_order)
      error("fortran_order is True: mxq reads C-order arrays only (save np.ascontiguousarray(a))");
    return {dtype_for(*descr), *shape};
  }

  template <typename... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    fail(ErrorCode::kFormat, "npy file '", label_, "': header: ", parts...);
  }

 private:
  [[nodiscard]] char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  [[nodiscard]] bool at_end() const { return pos_ >= text_.size(); }

  [[noreturn]] void error_found(const std::string& expected) const {
    if (at_end()) error("expected ", expected, " at byte ", pos_, ", found the end of the header");
    error("expected ", expected, " at byte ", pos_, ", found ", printable(text_.substr(pos_), 24));
  }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }

  void expect(char c, const std::string& expected) {
    if (peek() != c || at_end()) error_found(expected);
    ++pos_;
  }

  std::string parse_string(const std::string& expected) {
    const char quote = peek();
    if (at_end() || (quote != '\'' && quote != '"')) error_found(expected);
    const std::size_t start = ++pos_;
    while (!at_end() && peek() != quote) {
      if (peek() == '\\') error("escape sequences in header strings are not supported");
      if (peek() == '\n') error("a header string is not closed before the end of the line");
      ++pos_;
    }
    if (at_end()) error("a header string starting at byte ", start - 1, " is not closed");
    ++pos_;
    return std::string(text_.substr(start, pos_ - 1 - start));
  }

  bool parse_bool() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word && !is_identifier(pos_ + word.size())) {
        pos_ += word.size();
        return value;
      }
    }
    error_found("True or False for fortran_order");
  }

  [[nodiscard]] bool is_identifier(std::size_t at) const {
    if (at >= text_.size()) return false;
    const char c = text_[at];
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }

  std::int64_t parse_extent(std::size_t index) {
    if (peek() < '0' || peek() > '9' || at_end())
      error_found("a non-negative integer for shape[" + std::to_string(index) + "]");
    std::uint64_t value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const auto digit = static_cast<std::uint64_t>(peek() - '0');
      if (value >
          (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - digit) / 10)
        error("shape[", index, "] does not fit in a 64-bit signed integer");
      value = value * 10 + digit;
      ++pos_;
    }
    if (is_identifier(pos_)) error_found("',' or ')' after shape[" + std::to_string(index) + "]");
    return static_cast<std::int64_t>(value);
  }

  // A Python tuple: (), (n,), (n, m) or (n, m,). "(n)" is an int, not a tuple, as numpy says too.
  Shape parse_shape() {
    expect('(', "a tuple such as (2, 3) for shape");
    Shape shape;
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')' || at_end()) {
      if (shape.rank() == Shape::kMaxDims)
        error("shape: expected at most ", Shape::kMaxDims, " dimensions, found more");
      shape.push_back(parse_extent(static_cast<std::size_t>(shape.rank())));
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        error_found("',' or ')' in the shape tuple");
      }
    }
    ++pos_;  // ')'
    if (shape.rank() == 1 && !trailing_comma)
      error("shape: '(n)' is not a tuple; a 1-D shape is written '(n,)'");
    return shape;
  }

  DType dtype_for(const std::string& descr) const {
    for (const auto& spelling : kDescrs) {
      if (spelling.descr == descr) return spelling.dtype;
    }
    if (!descr.empty() && descr[0] == '>')
      error("descr ", printable(descr),
            " is big-endian; mxq reads little-endian data only (expected one of ", kSupportedDescrs,
            "; convert with a.astype(a.dtype.newbyteorder('<')))");
    error("descr ", printable(descr), " is not supported; expected one of ", kSupportedDescrs);
  }

  std::string label_;
  std::string_view text_;
  std::size_t pos_ = 0;
};

std::uint64_t little_endian(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

std::string_view descr_for(DType dtype) {
  for (const auto& spelling : kDescrs) {
    if (spelling.dtype == dtype) return spelling.descr;
  }
  return {};
}

// numpy.save's header for a C-order array: magic, version, length, dict, spaces, newline.
std::string npy_header(std::string_view descr, const Shape& shape) {
  std::string shape_text = "(";
  for (int i = 0; i < shape.rank(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
  shape_text += shape.rank() == 1 ? ",)" : ")";
  std::string dict = "{'descr': '" + std::string(descr) +
                     "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // numpy leaves room for the first extent to grow in place (GROWTH_AXIS_MAX_DIGITS).
  if (shape.rank() > 0) dict.append(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  // Version 1.0 stores the header length in 2 bytes; 2.0 in 4 (for headers of 64 KiB and more).
  for (const auto& [major, length_bytes] :
       {std::pair{1, std::size_t{2}}, std::pair{2, std::size_t{4}}}) {
    const std::size_t prefix = kMagic.size() + 2 + length_bytes;
    const std::size_t with_newline = dict.size() + 1;
    // numpy's formula: a header that is already aligned still gets a full kArrayAlign of spaces.
    const std::size_t padding = kArrayAlign - (prefix + with_newline) % kArrayAlign;
    const std::size_t header_length = with_newline + padding;
    if (length_bytes == 2 && header_length > 0xffff) continue;
    std::string out(kMagic);
    out.push_back(static_cast<char>(major));
    out.push_back('\0');
    for (std::size_t i = 0; i < length_bytes; ++i)
      out.push_back(static_cast<char>((header_length >> (8 * i)) & 0xff));
    out += dict;
    out.append(padding, ' ');
    out.push_back('\n');
    return out;
  }
  fail(ErrorCode::kInternal, "npy header of ", dict.size(), " bytes does not fit format 2.0");
}

}  // namespace

Tensor parse_npy(std::span<const std::byte> bytes, const std::string& label) {
  const auto format_error = [&](const auto&... parts) {
    fail(ErrorCode::kFormat, "npy file '", label, "': ", parts...);
  };
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (text.size() < kMagic.size() || text.substr(0, kMagic.size()) != kMagic)
    format_error("expected the magic string \\x93NUMPY at the start, found ",
                 printable(text.substr(0, kMagic.size())), " (not an .npy file)");
  if (bytes.size() < kMagic.size() + 2)
    format_error("the file ends inside the format version (", bytes.size(), " bytes)");
  const auto major = static_cast<int>(bytes[6]);
  const auto minor = static_cast<int>(bytes[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    format_error("format version ", major, ".", minor,
                 " is not supported (expected 1.0, 2.0 or 3.0)");
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = kMagic.size() + 2 + length_bytes;
  if (bytes.size() < prefix)
    format_error("the file ends inside the header length (", bytes.size(),
                 " bytes, expected at least ", prefix, ")");
  const std::uint64_t header_length = little_endian(bytes.subspan(kMagic.size() + 2, length_bytes));
  if (header_length > bytes.size() - prefix)
    format_error("header length ", header_length, " exceeds the ", bytes.size() - prefix,
                 " bytes that follow it: the file is truncated");
  const std::size_t data_start = prefix + static_cast<std::size_t>(header_length);
  const NpyHeader header =
      HeaderDictParser(label, text.substr(prefix, static_cast<std::size_t>(header_length))).parse();

  const auto dense = detail::dense_nbytes(header.shape, header.dtype);
  if (!dense)
    format_error("shape ", header.shape, " of ", header.dtype,
                 " is too large: its non-zero extents multiply to more than 2^63 bytes");
  const std::uint64_t nbytes = *dense;
  const std::size_t payload = bytes.size() - data_start;
  if (payload < nbytes)
    format_error("expected ", nbytes, " bytes of array data for shape ", header.shape, " of ",
                 header.dtype, ", found ", payload, ": the file is truncated");
  if (payload > nbytes)
    format_error("expected ", nbytes, " bytes of array data for shape ", header.shape, " of ",
                 header.dtype, ", found ", payload, " (", payload - nbytes,
                 " unexpected bytes at the end)");
  Tensor tensor = Tensor::empty(header.dtype, header.shape);
  if (nbytes > 0) std::memcpy(tensor.data(), bytes.data() + data_start, nbytes);
  return tensor;
}

Tensor read_npy(const std::string& path) {
  const auto mapping = detail::MappedFile::open(path, "npy file");
  return parse_npy(mapping->bytes(), path);
}

void write_npy(const std::string& path, const TensorView& tensor) {
  require_device(tensor, "write_npy tensor", Device::cpu());
  require_contiguous(tensor, "write_npy tensor");
  const std::string_view descr = descr_for(tensor.dtype());
  if (descr.empty())
    fail(ErrorCode::kUnsupported,
         "write_npy tensor: expected dtype f32, f16, i32, i64 or u8, found ", tensor.dtype());
  if (tensor.nbytes() > 0 && tensor.data() == nullptr)
    fail(ErrorCode::kInvalidArgument, "write_npy tensor: expected data for ", tensor.nbytes(),
         " bytes, found a null pointer");
  const std::string header = npy_header(descr, tensor.shape());
  const std::array<std::span<const std::byte>, 2> pieces = {
      std::as_bytes(std::span<const char>(header)),
      std::span<const std::byte>(tensor.bytes(), tensor.nbytes())};
  detail::write_file_atomically(path, pieces, "npy file");
}

}  // namespace mxq::io
