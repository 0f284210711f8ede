#include "tune/json_reader.h"

#include <charconv>

#include "mxq/core/error.h"

namespace mxq::tune::detail {

void JsonReader::error(const std::string& what) const {
  fail(ErrorCode::kFormat, "not valid JSON at byte ", pos_, ": ", what);
}

void JsonReader::skip_whitespace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
    ++pos_;
  }
}

char JsonReader::next_char() {
  skip_whitespace();
  if (pos_ >= text_.size()) error("unexpected end of text");
  return text_[pos_];
}

void JsonReader::expect(char c) {
  if (next_char() != c) error(std::string("expected '") + c + "', found '" + text_[pos_] + "'");
  ++pos_;
}

JsonReader::Kind JsonReader::peek() {
  const char c = next_char();
  switch (c) {
    case '{':
      return Kind::kObject;
    case '[':
      return Kind::kArray;
    case '"':
      return Kind::kString;
    case 't':
    case 'f':
      return Kind::kBool;
    case 'n':
      return Kind::kNull;
    default:
      if (c == '-' || (c >= '0' && c <= '9')) return Kind::kNumber;
      error(std::string("unexpected character '") + c + "'");
  }
}

void JsonReader::begin_object() {
  if (depth_ >= kMaxDepth) error("nesting deeper than " + std::to_string(kMaxDepth));
  expect('{');
  first_[++depth_] = true;
}

bool JsonReader::next_member(std::string& key) {
  const char c = next_char();
  if (c == '}') {
    ++pos_;
    --depth_;
    return false;
  }
  if (!first_[depth_]) expect(',');
  first_[depth_] = false;
  key = read_string();
  expect(':');
  return true;
}

void JsonReader::begin_array() {
  if (depth_ >= kMaxDepth) error("nesting deeper than " + std::to_string(kMaxDepth));
  expect('[');
  first_[++depth_] = true;
}

bool JsonReader::next_element() {
  const char c = next_char();
  if (c == ']') {
    ++pos_;
    --depth_;
    return false;
  }
  if (!first_[depth_]) expect(',');
  first_[depth_] = false;
  return true;
}

void JsonReader::append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

std::string JsonReader::read_string() {
  expect('"');
  std::string out;
  while (true) {
    // Fast path: copy the run up to the next quote, backslash or control character.
    const std::size_t start = pos_;
    while (pos_ < text_.size()) {
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"' || c == '\\' || c < 0x20) break;
      ++pos_;
    }
    out.append(text_.substr(start, pos_ - start));
    if (pos_ >= text_.size()) error("unterminated string");
    const char c = text_[pos_++];
    if (c == '"') return out;
    if (c != '\\') error("control character in string");
    if (pos_ >= text_.size()) error("unterminated escape");
    const char e = text_[pos_++];
    switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        auto hex4 = [&]() {
          if (pos_ + 4 > text_.size()) error("short \\u escape");
          std::uint32_t v = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[pos_++];
            v <<= 4;
            if (h >= '0' && h <= '9') {
              v |= static_cast<std::uint32_t>(h - '0');
            } else if (h >= 'a' && h <= 'f') {
              v |= static_cast<std::uint32_t>(h - 'a' + 10);
            } else if (h >= 'A' && h <= 'F') {
              v |= static_cast<std::uint32_t>(h - 'A' + 10);
            } else {
              error("bad hex digit in \\u escape");
            }
          }
          return v;
        };
        std::uint32_t code = hex4();
        if (code >= 0xD800 && code <= 0xDBFF) {
          if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            error("unpaired surrogate");
          }
          pos_ += 2;
          const std::uint32_t low = hex4();
          if (low < 0xDC00 || low > 0xDFFF) error("bad low surrogate");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code <= 0xDFFF) {
          error("unpaired surrogate");
        }
        append_utf8(out, code);
        break;
      }
      default:
        error(std::string("bad escape \\") + e);
    }
  }
}

std::string_view JsonReader::number_token() {
  skip_whitespace();
  const std::size_t start = pos_;
  auto digits = [&] {
    const std::size_t from = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ - from;
  };
  if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
  if (pos_ < text_.size() && text_[pos_] == '0') {
    ++pos_;
  } else if (digits() == 0) {
    error("expected a number");
  }
  if (pos_ < text_.size() && text_[pos_] == '.') {
    ++pos_;
    if (digits() == 0) error("expected digits after '.'");
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (digits() == 0) error("expected exponent digits");
  }
  return text_.substr(start, pos_ - start);
}

double JsonReader::read_number() {
  const std::string_view token = number_token();
  double value = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || end != token.data() + token.size()) error("number out of range");
  return value;
}

std::int64_t JsonReader::read_int() {
  const std::string_view token = number_token();
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || end != token.data() + token.size()) {
    error("expected an integer, found " + std::string(token));
  }
  return value;
}

bool JsonReader::try_read_int(std::int64_t& value) {
  const std::string_view token = number_token();
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size();
}

void JsonReader::skip_value() { skip_value_at(depth_); }

void JsonReader::skip_value_at(int depth) {
  std::string key;
  switch (peek()) {
    case Kind::kObject:
      if (depth >= kMaxDepth) error("nesting too deep");
      begin_object();
      while (next_member(key)) skip_value_at(depth + 1);
      return;
    case Kind::kArray:
      if (depth >= kMaxDepth) error("nesting too deep");
      begin_array();
      while (next_element()) skip_value_at(depth + 1);
      return;
    case Kind::kString:
      (void)read_string();
      return;
    case Kind::kNumber:
      (void)number_token();
      return;
    case Kind::kBool:
    case Kind::kNull: {
      for (std::string_view word : {"true", "false", "null"}) {
        if (text_.substr(pos_, word.size()) == word) {
          pos_ += word.size();
          return;
        }
      }
      error("bad literal");
    }
  }
}

void JsonReader::expect_end() {
  skip_whitespace();
  if (pos_ != text_.size()) error("trailing characters after the top-level value");
}

}  // namespace mxq::tune::detail
