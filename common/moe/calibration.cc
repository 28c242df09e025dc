#include "common/moe/calibration.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/engine/perplexity.h"
#include "common/util/sha256.h"
#include "common/util/status.h"

namespace tandem::moe {

Calibrator::Calibrator(const model::ModelConfig& c)
    : hidden_(static_cast<int>(c.hidden_size)),
      inter_(static_cast<int>(c.intermediate_size)),
      experts_(static_cast<int>(c.num_local_experts)),
      top_k_(static_cast<int>(c.num_experts_per_tok)) {
  stats_.layers.resize(c.num_hidden_layers);
  for (LayerStats& layer : stats_.layers) {
    layer.frequency.assign(experts_, 0);
    layer.mass.assign(experts_, 0);
    layer.ean.assign(experts_, 0);
    layer.reap.assign(experts_, 0);
    layer.neuron_importance.assign(experts_, std::vector<double>(inter_, 0));
  }
  reap_sum_.assign(stats_.layers.size() * experts_, 0);
  step_norms_.resize(c.num_hidden_layers);
}

void Calibrator::OnExpert(int layer, int expert, int width, absl::Span<const int> tokens,
                          const float* act, const float* out) {
  std::vector<double>& importance = stats_.layers[layer].neuron_importance[expert];
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* a = act + i * width;
    for (int n = 0; n < width; ++n) importance[n] += std::fabs(a[n]);
    const float* o = out + i * hidden_;
    double norm = 0;
    for (int d = 0; d < hidden_; ++d) norm += static_cast<double>(o[d]) * o[d];
    step_norms_[layer][{tokens[i], expert}] = std::sqrt(norm);
  }
}

absl::Status Calibrator::AddStep(const engine::RouterTrace& trace) {
  if (trace.experts.size() != stats_.layers.size()) {
    return absl::InvalidArgumentError("the router trace does not cover every layer");
  }
  int64_t tokens = -1;
  for (size_t l = 0; l < stats_.layers.size(); ++l) {
    LayerStats& layer = stats_.layers[l];
    const std::vector<int32_t>& chosen = trace.experts[l];
    const std::vector<float>& probs = trace.probs[l];
    const int64_t n = static_cast<int64_t>(chosen.size()) / top_k_;
    if (n > 0) tokens = n;  // a dense layer routes nothing
    for (int64_t t = 0; t < n; ++t) {
      for (int j = 0; j < top_k_; ++j) {
        const int e = chosen[t * top_k_ + j];
        const double g = probs[t * experts_ + e];
        auto norm = step_norms_[l].find({static_cast<int>(t), e});
        if (norm == step_norms_[l].end()) {
          return absl::InvalidArgumentError(absl::StrCat("no expert output observed for token ", t,
                                                         ", expert ", e, ", layer ", l));
        }
        ++layer.frequency[e];
        layer.mass[e] += g;
        layer.ean[e] += norm->second;
        reap_sum_[l * experts_ + e] += g * norm->second;
      }
      // The token's leading pair: its two experts of highest router weight (its only pair under
      // top-2).
      if (top_k_ >= 2) {
        const int first = chosen[t * top_k_], second = chosen[t * top_k_ + 1];
        ++layer.pairs[{std::min(first, second), std::max(first, second)}];
        if (first < second) ++layer.pair_a_first[{first, second}];  // the lower index ranks first
      }
    }
    step_norms_[l].clear();
  }
  stats_.tokens += tokens;
  return absl::OkStatus();
}

CalibrationStats Calibrator::Finish() const {
  CalibrationStats out = stats_;
  for (size_t l = 0; l < out.layers.size(); ++l) {
    for (int e = 0; e < experts_; ++e) {
      const int64_t f = out.layers[l].frequency[e];
      out.layers[l].reap[e] = f == 0 ? 0 : reap_sum_[l * experts_ + e] / f;
    }
  }
  return out;
}

nlohmann::json CalibrationStats::ToJson() const {
  nlohmann::json doc = {{"format", "tandem-calibration-v1"},
                        {"model", model},
                        {"text", text},
                        {"text_sha256", text_sha256},
                        {"tokens", tokens}};
  nlohmann::json layers_json = nlohmann::json::array();
  for (const LayerStats& layer : layers) {
    nlohmann::json pairs_json = nlohmann::json::array();
    for (const auto& [pair, count] : layer.pairs) {
      auto first = layer.pair_a_first.find(pair);
      pairs_json.push_back(
          {pair.first, pair.second, count, first == layer.pair_a_first.end() ? 0 : first->second});
    }
    layers_json.push_back({{"frequency", layer.frequency},
                           {"mass", layer.mass},
                           {"ean", layer.ean},
                           {"reap", layer.reap},
                           {"pairs", pairs_json},
                           {"neuron_importance", layer.neuron_importance}});
  }
  doc["layers"] = layers_json;
  return doc;
}

absl::StatusOr<CalibrationStats> CalibrationStats::FromJson(const nlohmann::json& doc) {
  if (!doc.is_object() || doc.value("format", "") != "tandem-calibration-v1") {
    return absl::InvalidArgumentError("not a tandem-calibration-v1 document");
  }
  CalibrationStats stats;
  try {
    stats.model = doc.at("model").get<std::string>();
    stats.text = doc.at("text").get<std::string>();
    stats.text_sha256 = doc.value("text_sha256", "");
    stats.tokens = doc.at("tokens").get<int64_t>();
    for (const auto& l : doc.at("layers")) {
      LayerStats layer;
      layer.frequency = l.at("frequency").get<std::vector<int64_t>>();
      layer.mass = l.at("mass").get<std::vector<double>>();
      layer.ean = l.at("ean").get<std::vector<double>>();
      layer.reap = l.at("reap").get<std::vector<double>>();
      layer.neuron_importance = l.at("neuron_importance").get<std::vector<std::vector<double>>>();
      for (const auto& p : l.at("pairs")) {
        const std::pair<int, int> pair{p.at(0).get<int>(), p.at(1).get<int>()};
        layer.pairs[pair] = p.at(2).get<int64_t>();
        if (p.size() > 3) layer.pair_a_first[pair] = p.at(3).get<int64_t>();
      }
      const size_t experts = layer.frequency.size();
      if (layer.mass.size() != experts || layer.ean.size() != experts ||
          layer.reap.size() != experts || layer.neuron_importance.size() != experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", stats.layers.size(), ": per-expert lists differ in length"));
      }
      stats.layers.push_back(std::move(layer));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed calibration statistics: ", e.what()));
  }
  return stats;
}

absl::StatusOr<CalibrationStats> LoadCalibrationStats(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read calibration statistics ", path));
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<CalibrationStats> stats = CalibrationStats::FromJson(doc);
  if (!stats.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", stats.status().message()));
  }
  return stats;
}

absl::StatusOr<CalibrationStats> Calibrate(engine::ForwardPass* forward,
                                           const model::Tokenizer& tokenizer,
                                           const std::string& text_path,
                                           const std::function<void(double)>& progress) {
  const model::ModelConfig& c = forward->weights().config;
  const int window = static_cast<int>(c.max_position_embeddings) - 1;
  ASSIGN_OR_RETURN(engine::ProtocolText text,
                   engine::ReadProtocolText(tokenizer, text_path, window));
  Calibrator calibrator(c);
  forward->SetExpertObserver(&calibrator);
  absl::Status status;
  for (size_t w = 0; w < text.windows.size() && status.ok(); ++w) {
    const engine::ProtocolWindow& win = text.windows[w];
    std::vector<int32_t> input = {tokenizer.bos_id()};
    input.insert(input.end(), text.scored.begin() + win.begin,
                 text.scored.begin() + win.begin + win.size);
    engine::BlockTable table;
    status = table.Reserve(forward->pool(), static_cast<int>(input.size()));
    if (!status.ok()) break;
    engine::StepInput in{input, 0, &table, engine::LogitRows::kNone};
    std::vector<std::vector<float>> logits;
    engine::RouterTrace trace;
    status = forward->Step({&in, 1}, {}, &logits, &trace);
    if (status.ok()) status = calibrator.AddStep(trace);
    table.ReleaseAll(forward->pool());
    if (progress) progress(static_cast<double>(w + 1) / text.windows.size());
  }
  forward->SetExpertObserver(nullptr);
  RETURN_IF_ERROR(status);
  CalibrationStats stats = calibrator.Finish();
  stats.text = text_path;
  ASSIGN_OR_RETURN(stats.text_sha256, util::Sha256OfFile(text_path));
  return stats;
}

}  // namespace tandem::moe
