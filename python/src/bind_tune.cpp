// The autotuner (mxq::tune::Autotuner, TuningSession) for mxq.autotune(): tuning passes over
// problems, lookups, and the linear tactic an autotuner decision names.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "block_shape_arg.h"
#include "mxq/core/error.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"

namespace mxq::python {
namespace {

nb::dict record_dict(const tune::TuneRecord& r) {
  nb::dict d;
  d["pass"] = r.pass;
  d["problem"] = r.problem;
  d["op"] = r.op;
  d["bucket"] = r.bucket;
  d["status"] = std::string(tune::to_string(r.status));
  d["tactic"] = r.tactic;
  d["reason"] = r.reason;
  d["median_us"] = r.median_us;
  d["default_us"] = r.default_us;
  d["seconds"] = r.seconds;
  nb::list candidates;
  for (const tune::CandidateResult& c : r.candidates) {
    nb::dict cd;
    cd["tactic"] = c.tactic;
    cd["status"] = c.status;
    cd["median_us"] = c.median_us;
    candidates.append(cd);
  }
  d["candidates"] = candidates;
  return d;
}

}  // namespace

void bind_tune(nb::module_& m) {
  nb::class_<tune::Problem>(m, "TuneProblem",
                            "An op's static problem (shape and dtypes, never the token count): "
                            "the key of autotuner decisions, with a token bucket.")
      .def_static(
          "block_fp8_linear",
          [](std::int64_t n, std::int64_t k, nb::handle block, const std::string& activation_scales,
             const std::string& out_dtype) {
            DType out = DType::kBF16;
            if (out_dtype == "f32" || out_dtype == "float32") {
              out = DType::kF32;
            } else if (out_dtype != "bf16" && out_dtype != "bfloat16") {
              fail_argument(ErrorCode::kInvalidArgument, "out_dtype", "\"bf16\" or \"f32\"",
                            "\"" + out_dtype + "\"");
            }
            return linear::block_fp8_linear_problem(
                n, k, block_shape_arg(block, "block"),
                parse_scale_mode(activation_scales, "activation_scales"), out);
          },
          nb::arg("n"), nb::arg("k"), nb::arg("block") = nb::make_tuple(128, 128),
          nb::arg("activation_scales") = "fp32", nb::arg("out_dtype") = "bf16",
          "The block_fp8_linear problem (N, K, block, activation scales, output dtype).")
      .def_prop_ro("op", &tune::Problem::op)
      .def_prop_ro("canonical", &tune::Problem::canonical)
      .def("__repr__", [](const tune::Problem& p) { return "TuneProblem(" + p.canonical() + ")"; });

  nb::class_<tune::Autotuner>(
      m, "Autotuner",
      "mxq::tune::Autotuner: serves a tactic per (problem, token count) from its cache file and "
      "tunes what the cache lacks inside TuningSessions.")
      .def(
          "__init__",
          [](tune::Autotuner* self, const std::string& mode, std::optional<std::string> cache,
             const std::string& backend, int device, std::optional<double> budget_seconds,
             std::optional<std::vector<std::string>> skip_ops) {
            tune::AutotunerConfig config;
            // The environment (MXQ_AUTOTUNE_*) gives the rest; the arguments given win.
            config.options = tune::AutotuneOptions::from_env();
            config.options.mode = tune::autotune_mode_from_string(mode);
            if (cache) config.options.cache_path = *cache;
            if (budget_seconds) config.options.budget_seconds = *budget_seconds;
            if (skip_ops) config.options.skip_ops = *skip_ops;
            config.backend = tune::backend_from_string(backend);
            config.device = device;
            const nb::gil_scoped_release release;
            new (self) tune::Autotuner(std::move(config));
          },
          nb::arg("mode") = "tune", nb::arg("cache") = nb::none(), nb::arg("backend") = "cpu",
          nb::arg("device") = 0, nb::arg("budget_seconds") = nb::none(),
          nb::arg("skip_ops") = nb::none())
      .def_prop_ro("mode",
                   [](const tune::Autotuner& t) { return std::string(to_string(t.mode())); })
      .def_prop_ro("backend",
                   [](const tune::Autotuner& t) { return std::string(to_string(t.backend())); })
      .def_prop_ro("cache_path", &tune::Autotuner::cache_path)
      .def_prop_ro("warnings", &tune::Autotuner::warnings)
      .def_prop_ro("measured_count", &tune::Autotuner::measured_count)
      .def(
          "lookup",
          [](const tune::Autotuner& t, const tune::Problem& problem, std::int64_t tokens) {
            const tune::Selection s = t.lookup(problem, tokens);
            nb::dict d;
            d["tactic"] = s.tactic != nullptr ? nb::cast(s.tactic->id()) : nb::none();
            d["source"] = std::string(tune::to_string(s.source));
            return d;
          },
          nb::arg("problem"), nb::arg("tokens"),
          "The tactic served for `tokens` tokens: its id and source (tuned, default, ...).")

      .def("publish", &tune::Autotuner::publish, nb::call_guard<nb::gil_scoped_release>())
      .def("decisions", [](const tune::Autotuner& t) {
        nb::list out;
        for (const tune::CacheEntry& e : t.decisions()) {
          nb::dict d;
          d["problem"] = e.problem.canonical();
          d["bucket"] = e.bucket;
          d["tactic"] = e.tactic;
          d["pass"] = e.pass;
          d["median_us"] = e.median_us;
          d["default_us"] = e.default_us;
          out.append(d);
        }
        return out;
      });

  nb::class_<tune::TuningSession>(
      m, "TuningSession",
      "One tuning pass (\"target\", \"draft\", ...): misses are measured and saved one by one; "
      "close() saves and publishes (the destructor does too, also after an exception).")
      .def(
          "__init__",
          [](tune::TuningSession* self, tune::Autotuner& tuner, const std::string& pass,
             std::optional<double> budget_seconds) {
            const nb::gil_scoped_release release;
            new (self) tune::TuningSession(tuner, pass, budget_seconds);
          },
          nb::arg("tuner"), nb::arg("pass_name"), nb::arg("budget_seconds") = nb::none(),
          nb::keep_alive<1, 2>())
      .def(
          "tune_tokens",
          [](tune::TuningSession& s, const tune::Problem& problem,
             const std::vector<std::int64_t>& tokens) {
            std::vector<tune::TuneRecord> records;
            {
              const nb::gil_scoped_release release;
              records = s.tune_tokens(problem, tokens);
            }
            nb::list out;
            for (const tune::TuneRecord& r : records) out.append(record_dict(r));
            return out;
          },
          nb::arg("problem"), nb::arg("tokens"),
          "Tunes the buckets serving these token counts (each once); one record per bucket.")
      .def("close", &tune::TuningSession::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("pass_name", &tune::TuningSession::pass)
      .def_prop_ro("records", [](const tune::TuningSession& s) {
        nb::list out;
        for (const tune::TuneRecord& r : s.records()) out.append(record_dict(r));
        return out;
      });
}

}  // namespace mxq::python
