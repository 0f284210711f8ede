// safetensors: 8-byte little-endian header length N, N bytes of JSON header, then the data
// section. Every number taken from the file is checked before it is used as a size or an offset.
#include "mxq/io/safetensors.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "io/file_util.h"

namespace mxq::io {
namespace {

// std::map-backed objects: ordered_json finds keys by linear search, which makes a header with
// n tensors cost O(n^2) to parse (a hang for a malicious header of a million keys).
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // for writing the fields of an entry in order
using detail::printable;

constexpr std::size_t kHeaderLengthBytes = 8;
// The reference implementation refuses headers above 100 MB; a larger one is not a real file.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kSupportedDtypes =
    "U8, I8, I32, I64, F32, BF16, F16, F8_E4M3, F8_E8M0, BOOL";

// A JSON value for an error message. Containers are described, not dumped: dump() recurses, and
// a malicious header can nest arrays deeper than the stack.
std::string found(const Json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size()) + " elements";
  if (value.is_object()) return "an object with " + std::to_string(value.size()) + " keys";
  if (value.is_string()) return "the string " + printable(value.get<std::string>(), 48);
  if (value.is_number_unsigned()) return "the non-negative integer " + value.dump();
  if (value.is_number_integer()) return "the negative integer " + value.dump();
  if (value.is_number_float()) return "the floating-point number " + value.dump();
  if (value.is_boolean()) return "the boolean " + value.dump();
  return "null";
}

// SAX handler: records the top-level keys in order and stops at the first key repeated within
// one object (nlohmann/json would keep the last silently: the file would mean two things).
struct KeyWatcher {
  std::vector<std::set<std::string>> open_objects;
  std::vector<std::string> top_level_keys;
  std::string duplicate;
  std::string syntax_error;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t) { return true; }
  bool number_unsigned(Json::number_unsigned_t) { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) { return true; }
  bool string(Json::string_t&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    open_objects.emplace_back();
    return true;
  }
  bool key(Json::string_t& name) {
    if (open_objects.size() == 1) top_level_keys.push_back(name);
    if (open_objects.back().insert(name).second) return true;
    duplicate = name;
    return false;
  }
  bool end_object() {
    open_objects.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& error) {
    syntax_error = error.what();
    return false;
  }
};

class HeaderParser {
 public:
  HeaderParser(std::string_view label, std::size_t data_size)
      : label_(label), data_size_(data_size) {}

  template <typename... Parts>
  [[noreturn]] void format_error(const Parts&... parts) const {
    fail(ErrorCode::kFormat, "safetensors file '", label_, "': ", parts...);
  }

  struct ParsedHeader {
    Json json;
    std::vector<std::string> keys;  // the top-level keys in header order
  };

  ParsedHeader parse_json(std::string_view text) const {
    // nlohmann/json stops at a NUL byte as at the end of input, which would hide what follows;
    // a raw NUL is never valid JSON (control characters in strings must be escaped).
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)
      format_error("the header is not valid JSON: a NUL byte at header offset ", nul);
    // A first pass over SAX events finds repeated keys and the top-level key order (the DOM keeps
    // neither); nlohmann's parser callback would do both but rescans the parent object at the
    // end of every object, O(n^2) in the number of tensors.
    KeyWatcher watcher;
    const bool valid = Json::sax_parse(text.begin(), text.end(), &watcher);
    if (!valid && !watcher.duplicate.empty())
      format_error("the header repeats the key ", printable(watcher.duplicate));
    if (!valid) format_error("the header is not valid JSON: ", watcher.syntax_error);
    ParsedHeader parsed_header;
    try {
      parsed_header.json = Json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::exception& error) {
      format_error("the header is not valid JSON: ", error.what());
    }
    if (!parsed_header.json.is_object())
      format_error("the header must be a JSON object, found ", found(parsed_header.json));
    parsed_header.keys = std::move(watcher.top_level_keys);
    return parsed_header;
  }

  std::map<std::string, std::string> parse_metadata(const Json& value) const {
    if (!value.is_object())
      format_error("__metadata__: expected an object of strings, found ", found(value));
    std::map<std::string, std::string> metadata;
    for (const auto& [key, text] : value.items()) {
      if (!text.is_string())
        format_error("__metadata__ ", printable(key), ": expected a string, found ", found(text));
      metadata.emplace(key, text.get<std::string>());
    }
    return metadata;
  }

  SafetensorsEntry parse_entry(const std::string& name, const Json& value) const {
    const std::string where = "tensor " + printable(name);
    if (!value.is_object())
      format_error(where, ": expected an object with dtype, shape and data_offsets, found ",
                   found(value));
    for (const auto& [key, field] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        format_error(where, ": unexpected field ", printable(key),
                     " (expected only dtype, shape and data_offsets)");
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) format_error(where, ": missing field '", key, "'");
    }
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = parse_dtype(where, value["dtype"]);
    entry.shape = parse_shape(where, value["shape"]);
    const std::uint64_t nbytes = checked_nbytes(where, entry.shape, entry.dtype);
    parse_offsets(where, value["data_offsets"], nbytes, entry);
    return entry;
  }

  // Entries sorted by data offset; overlapping byte ranges would alias two tensors.
  void require_disjoint(std::vector<SafetensorsEntry>& entries) const {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto& a, const auto& b) { return a.begin < b.begin; });
    const SafetensorsEntry* previous = nullptr;
    for (const auto& entry : entries) {
      if (entry.begin == entry.end) continue;  // an empty range overlaps nothing
      if (previous != nullptr && entry.begin < previous->end)
        format_error("tensors ", printable(previous->name), " (bytes [", previous->begin, ", ",
                     previous->end, ")) and ", printable(entry.name), " (bytes [", entry.begin,
                     ", ", entry.end, ")) overlap in the data section");
      previous = &entry;
    }
  }

 private:
  DType parse_dtype(const std::string& where, const Json& value) const {
    if (!value.is_string()) format_error(where, ": dtype: expected a string, found ", found(value));
    const auto code = value.get<std::string>();
    const auto dtype = dtype_from_safetensors(code);
    if (!dtype)
      format_error(where, ": dtype: expected one of ", kSupportedDtypes, ", found ",
                   printable(code));
    return *dtype;
  }

  Shape parse_shape(const std::string& where, const Json& value) const {
    if (!value.is_array())
      format_error(where, ": shape: expected an array of non-negative integers, found ",
                   found(value));
    if (value.size() > static_cast<std::size_t>(Shape::kMaxDims))
      format_error(where, ": shape: expected at most ", Shape::kMaxDims, " dimensions, found ",
                   value.size());
    Shape shape;
    for (std::size_t i = 0; i < value.size(); ++i) {
      const Json& extent = value[i];
      if (!extent.is_number_unsigned() ||
          extent.get<std::uint64_t>() >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        format_error(where, ": shape[", i, "]: expected a non-negative integer, found ",
                     found(extent));
      shape.push_back(extent.get<std::int64_t>());
    }
    return shape;
  }

  std::uint64_t checked_nbytes(const std::string& where, const Shape& shape, DType dtype) const {
    const auto nbytes = detail::dense_nbytes(shape, dtype);
    if (!nbytes)
      format_error(where, ": shape ", shape, " of ", dtype,
                   " is too large: its non-zero extents multiply to more than 2^63 bytes");
    return *nbytes;
  }

  std::uint64_t parse_offset(const std::string& where, const Json& value, int index) const {
    if (!value.is_number_unsigned())
      format_error(where, ": data_offsets[", index, "]: expected a non-negative integer, found ",
                   found(value));
    return value.get<std::uint64_t>();
  }

  void parse_offsets(const std::string& where, const Json& value, std::uint64_t nbytes,
                     SafetensorsEntry& entry) const {
    if (!value.is_array() || value.size() != 2)
      format_error(where, ": data_offsets: expected [begin, end], found ", found(value));
    const std::uint64_t begin = parse_offset(where, value[0], 0);
    const std::uint64_t end = parse_offset(where, value[1], 1);
    if (begin > end)
      format_error(where, ": data_offsets: expected begin <= end, found [", begin, ", ", end, "]");
    if (end > data_size_)
      format_error(where, ": data_offsets [", begin, ", ", end, "] end past the data section (",
                   data_size_, " bytes): the file is truncated or the header is wrong");
    if (end - begin != nbytes)
      format_error(where, ": data_offsets [", begin, ", ", end, "] span ", end - begin,
                   " bytes, expected ", nbytes, " for shape ", entry.shape, " of ", entry.dtype);
    entry.begin = static_cast<std::size_t>(begin);
    entry.end = static_cast<std::size_t>(end);
  }

  std::string label_;
  std::size_t data_size_;
};

}  // namespace

struct SafetensorsFile::State {
  std::string label;
  std::shared_ptr<const void> owner;         // the mapping for open(); null for parse()
  std::span<const std::byte> data;           // the data section
  std::vector<SafetensorsEntry> entries;     // sorted by data offset
  std::map<std::string, std::size_t> index;  // name -> position in entries
  std::map<std::string, std::string> metadata;
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto mapping = detail::MappedFile::open(path, "safetensors file");
  const std::span<const std::byte> bytes = mapping->bytes();
  return parse_owned(bytes, path, std::move(mapping));
}

SafetensorsFile SafetensorsFile::parse(std::span<const std::byte> bytes, std::string label) {
  return parse_owned(bytes, std::move(label), nullptr);
}

SafetensorsFile SafetensorsFile::parse_owned(std::span<const std::byte> bytes, std::string label,
                                             std::shared_ptr<const void> owner) {
  const HeaderParser parser(label, 0);
  if (bytes.size() < kHeaderLengthBytes)
    parser.format_error("expected at least ", kHeaderLengthBytes,
                        " bytes (the header length), found ", bytes.size(), " bytes");
  std::uint64_t header_length = 0;
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i)
    header_length |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  if (header_length > kMaxHeaderBytes)
    parser.format_error("header length ", header_length, " exceeds the limit of ", kMaxHeaderBytes,
                        " bytes (not a safetensors file, or corrupt)");
  if (header_length > bytes.size() - kHeaderLengthBytes)
    parser.format_error("header length ", header_length, " exceeds the ",
                        bytes.size() - kHeaderLengthBytes,
                        " bytes that follow it: the file is truncated or not a safetensors file");
  const auto header_size = static_cast<std::size_t>(header_length);
  const std::span<const std::byte> header_bytes = bytes.subspan(kHeaderLengthBytes, header_size);
  const std::span<const std::byte> data = bytes.subspan(kHeaderLengthBytes + header_size);

  const HeaderParser header_parser(label, data.size());
  const auto header = header_parser.parse_json(
      {reinterpret_cast<const char*>(header_bytes.data()), header_bytes.size()});

  auto state = std::make_shared<State>();
  state->label = std::move(label);
  state->owner = std::move(owner);
  state->data = data;
  for (const std::string& key : header.keys) {
    const Json& value = header.json.at(key);
    if (key == kMetadataKey) {
      state->metadata = header_parser.parse_metadata(value);
    } else {
      state->entries.push_back(header_parser.parse_entry(key, value));
    }
  }
  header_parser.require_disjoint(state->entries);
  for (std::size_t i = 0; i < state->entries.size(); ++i)
    state->index.emplace(state->entries[i].name, i);

  SafetensorsFile file;
  file.state_ = std::move(state);
  return file;
}

const SafetensorsFile::State& SafetensorsFile::state() const {
  if (!state_)
    fail(
        ErrorCode::kInvalidArgument,
        "SafetensorsFile: expected a file from open() or parse(), found a default-constructed one");
  return *state_;
}

const std::string& SafetensorsFile::path() const { return state().label; }

const std::vector<SafetensorsEntry>& SafetensorsFile::entries() const { return state().entries; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return state().metadata;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return state().index.contains(name);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const State& s = state();
  const auto found = s.index.find(name);
  if (found == s.index.end())
    fail(ErrorCode::kInvalidArgument, "safetensors file '", s.label, "': no tensor named ",
         printable(name), " (the file has ", s.entries.size(), " tensors)");
  return s.entries[found->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return state().data.subspan(e.begin, e.end - e.begin);
}

bool SafetensorsFile::is_aligned(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const auto address = reinterpret_cast<std::uintptr_t>(bytes(name).data());
  return address % size_of(e.dtype) == 0;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  // The mapping is read-only (PROT_READ): TensorView has no const flavour, and a write through
  // this pointer faults, which is the documented contract. The pointer may be misaligned for the
  // dtype (the format does not align data); callers copy from it unless is_aligned() says so.
  return TensorView(const_cast<std::byte*>(bytes(name).data()), e.dtype, e.shape, Device::cpu());
}

namespace {

// `text` as a JSON string literal; kInvalidArgument when it is not valid UTF-8 (JSON needs it).
std::string json_string(const std::string& text, std::string_view argument) {
  try {
    return Json(text).dump();
  } catch (const nlohmann::json::exception&) {
    fail(ErrorCode::kInvalidArgument, argument, ": expected valid UTF-8, found ", printable(text));
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // The header is assembled entry by entry so that it keeps the given order.
  std::string header_text = "{";
  const auto add_entry = [&](const std::string& key_literal, const std::string& value_json) {
    if (header_text.size() > 1) header_text += ',';
    header_text += key_literal;
    header_text += ':';
    header_text += value_json;
  };
  if (!metadata.empty()) {
    std::string object = "{";
    for (const auto& [key, value] : metadata) {
      if (object.size() > 1) object += ',';
      object += json_string(key, "write_safetensors metadata key");
      object += ':';
      object += json_string(value, "write_safetensors metadata value of " + printable(key));
    }
    add_entry("\"__metadata__\"", object + "}");
  }
  std::vector<std::span<const std::byte>> pieces(2);  // length prefix and header come first
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string argument = "write_safetensors tensor " + printable(name);
    const std::string name_literal = json_string(name, argument + " name");
    if (name == kMetadataKey)
      fail(ErrorCode::kInvalidArgument, argument,
           ": the name __metadata__ is reserved for the metadata object");
    if (!names.insert(name).second)
      fail(ErrorCode::kInvalidArgument, argument, ": the name appears twice in the tensor list");
    require_device(tensor, argument, Device::cpu());
    require_contiguous(tensor, argument);
    const std::string_view code = info(tensor.dtype()).safetensors;
    if (code.empty())
      fail(ErrorCode::kUnsupported, argument, ": dtype ", tensor.dtype(),
           " has no safetensors spelling; store packed FP4 (e2m1x2) as U8 bytes, two E2M1 codes "
           "per byte with element 2j in the low nibble");
    if (tensor.nbytes() > 0 && tensor.data() == nullptr)
      fail(ErrorCode::kInvalidArgument, argument, ": expected data for ", tensor.nbytes(),
           " bytes, found a null pointer");
    OrderedJson dims = OrderedJson::array();
    for (const std::int64_t extent : tensor.shape().dims()) dims.push_back(extent);
    const std::uint64_t end = offset + tensor.nbytes();
    // The reference implementation's field order: dtype, shape, data_offsets.
    const OrderedJson entry = {
        {"dtype", std::string(code)}, {"shape", std::move(dims)}, {"data_offsets", {offset, end}}};
    add_entry(name_literal, entry.dump());
    pieces.emplace_back(tensor.bytes(), tensor.nbytes());
    offset = end;
  }
  header_text += '}';
  // Padding to a multiple of 8 keeps the data section 8-byte aligned, as the reference writer does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  std::array<std::byte, kHeaderLengthBytes> length_prefix{};
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i)
    length_prefix[i] = static_cast<std::byte>((header_text.size() >> (8 * i)) & 0xff);
  pieces[0] = length_prefix;
  pieces[1] = std::as_bytes(std::span<const char>(header_text));
  detail::write_file_atomically(path, pieces, "safetensors file");
}

}  // namespace mxq::io
