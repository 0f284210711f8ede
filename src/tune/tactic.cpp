#include "mxq/tune/tactic.h"

#include "mxq/core/enum_names.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace mxq::tune {

namespace {
constexpr EnumNames<Backend, 2> kBackendNames{{{{Backend::kCpu, "cpu"}, {Backend::kCuda, "cuda"}}}};
}  // namespace

std::string_view to_string(Backend backend) { return kBackendNames.name(backend); }

Backend backend_from_string(std::string_view text) { return kBackendNames.parse(text, "backend"); }

TacticParams::TacticParams(std::initializer_list<TacticParam> params) {
  for (const TacticParam& p : params) set(p.name, p.value);
}

TacticParams::TacticParams(
    std::initializer_list<std::pair<std::string_view, std::int64_t>> params) {
  for (const auto& [name, value] : params) set(std::string(name), value);
}

void TacticParams::set(std::string name, std::string value) {
  const bool bad_char = std::any_of(name.begin(), name.end(), [](char c) {
    return c == ',' || c == '=' || c == '[' || c == ']' || c == ' ';
  });
  const bool bad_value = std::any_of(value.begin(), value.end(), [](char c) {
    return c == ',' || c == '=' || c == '[' || c == ']' || c == ' ';
  });
  if (name.empty() || bad_char || bad_value) {
    fail_argument(ErrorCode::kInvalidArgument, "tactic parameter",
                  "name=value without ',', '=', '[', ']' or spaces", name + "=" + value);
  }
  auto it = std::lower_bound(params_.begin(), params_.end(), name,
                             [](const TacticParam& p, const std::string& n) { return p.name < n; });
  if (it != params_.end() && it->name == name) {
    it->value = std::move(value);
  } else {
    params_.insert(it, TacticParam{std::move(name), std::move(value)});
  }
}

const std::string* TacticParams::find(std::string_view name) const {
  for (const TacticParam& p : params_) {
    if (p.name == name) return &p.value;
  }
  return nullptr;
}

std::int64_t TacticParams::get_int(std::string_view name) const {
  const std::string* value = find(name);
  if (value == nullptr) {
    fail(ErrorCode::kInvalidArgument, "tactic parameter '", name, "' is not set (have ",
         canonical(), ")");
  }
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (value->empty() || errno != 0 || *end != '\0') {
    fail_argument(ErrorCode::kInvalidArgument, "tactic parameter " + std::string(name),
                  "an integer", "'" + *value + "'");
  }
  return parsed;
}

std::string TacticParams::canonical() const {
  std::string out;
  for (const TacticParam& p : params_) {
    if (!out.empty()) out += ",";
    out += p.name + "=" + p.value;
  }
  return out;
}

std::string TokenRange::str() const {
  std::string out = "[";
  out.append(std::to_string(min)).append(", ");
  out.append(max == kUnbounded ? std::string("inf") : std::to_string(max)).append("]");
  return out;
}

std::string Tactic::id() const {
  if (params.empty()) return variant;
  return variant + "[" + params.canonical() + "]";
}

Support Tactic::supports(const Problem& problem) const {
  if (problem.op() != op) {
    return Support::no("tactic of op " + op + " asked about a problem of op " + problem.op());
  }
  if (!supports_fn) return Support::yes();
  return supports_fn(problem);
}

}  // namespace mxq::tune
