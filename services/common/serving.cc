#include "services/common/serving.h"

#include "common/util/status.h"

namespace tandem::serving {

absl::StatusOr<ServingEngine> LoadServingEngine(const std::string& model_dir, int block_size,
                                                int num_blocks, const engine::ExpertMask& only) {
  ServingEngine e;
  ASSIGN_OR_RETURN(e.model, engine::LoadModelDir(model_dir, {.only_experts = only}));
  const model::ModelConfig& c = e.model.weights->config;
  ASSIGN_OR_RETURN(
      e.pool, engine::KvBlockPool::Create({static_cast<int>(c.num_hidden_layers),
                                           static_cast<int>(c.num_key_value_heads),
                                           static_cast<int>(c.head_dim), block_size, num_blocks}));
  ASSIGN_OR_RETURN(e.forward, engine::ForwardPass::Create(e.model.weights.get(), e.pool.get()));
  return e;
}

engine::EngineLoop::StepObserver EngineStepObserver(DecodeMetrics* metrics, int total_blocks) {
  metrics->kv_blocks_free->Set(total_blocks);
  metrics->kv_blocks_used->Set(0);
  return [metrics, total_blocks](const engine::EngineLoop::StepReport& step) {
    if (step.stepped) {
      metrics->step_seconds->Observe(step.seconds);
      metrics->step_tokens->Observe(static_cast<double>(step.tokens));
      metrics->generated_tokens->Increment(static_cast<double>(step.generated));
      metrics->preemptions->Increment(static_cast<double>(step.preemptions));
    }
    metrics->running->Set(step.running);
    metrics->waiting->Set(step.waiting);
    metrics->kv_blocks_free->Set(step.free_blocks);
    metrics->kv_blocks_used->Set(total_blocks - step.free_blocks);
  };
}

void ReportResidentExperts(const engine::ModelWeights& weights, DecodeMetrics* metrics) {
  int64_t experts = 0, bytes = 0;
  for (const engine::LayerWeights& layer : weights.layers) {
    for (const engine::ExpertWeights& e : layer.experts) {
      if (e.gate.data.empty()) continue;
      ++experts;
      bytes += static_cast<int64_t>(e.gate.data.size() + e.up.data.size() + e.down.data.size()) *
               static_cast<int64_t>(sizeof(uint16_t));
    }
  }
  metrics->experts_resident->Set(static_cast<double>(experts));
  metrics->expert_weight_bytes->Set(static_cast<double>(bytes));
}

absl::StatusOr<engine::SamplingParams> SamplingFromProto(const tandem::v1::SamplingParams& proto,
                                                         int vocab_size) {
  engine::SamplingParams p;
  p.temperature = proto.temperature();
  p.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  p.top_k = proto.top_k();
  if (proto.has_seed()) p.seed = proto.seed();
  p.max_tokens = proto.max_tokens() == 0 ? kDefaultMaxTokens : proto.max_tokens();
  p.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.stop_strings.assign(proto.stop().begin(), proto.stop().end());
  p.ignore_eos = proto.ignore_eos();
  RETURN_IF_ERROR(p.Validate(vocab_size));
  return p;
}

tandem::v1::FinishReason FinishToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kNone:
      break;
  }
  return tandem::v1::FINISH_REASON_UNSPECIFIED;
}

kv::KvPeer PeerOf(const tandem::v1::KvTarget& target) {
  return {target.agent(), target.agent_address()};
}

}  // namespace tandem::serving
