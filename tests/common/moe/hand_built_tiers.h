// The hand-built case the tier tests share: one layer of four experts (24 neurons each) and
// 100 routed calibration tokens by leading pair: (0,1) 50, (0,2) 30, (1,2) 15, (2,3) 5; (0,3)
// and (1,3) never. Ranked first: 0 over 1 in 10 of 50 (1 dominates), 0 over 2 in 20 of 30 (0),
// 1 over 2 in 0 of 15 (2), 2 over 3 in 5 of 5 (2).
#pragma once

#include <vector>

#include "common/moe/calibration.h"
#include "tandem/v1/pruning_plan.pb.h"

namespace tandem::moe::testing {

inline CalibrationStats HandBuiltStats() {
  CalibrationStats stats;
  LayerStats layer;
  layer.frequency = {80, 65, 50, 5};
  layer.mass = layer.ean = layer.reap = {1, 1, 1, 1};
  layer.neuron_importance.assign(4, std::vector<double>(24, 0));
  layer.pairs = {{{0, 1}, 50}, {{0, 2}, 30}, {{1, 2}, 15}, {{2, 3}, 5}};
  layer.pair_a_first = {{{0, 1}, 10}, {{0, 2}, 20}, {{1, 2}, 0}, {{2, 3}, 5}};
  stats.layers = {layer};
  return stats;
}

// A plan of that layer keeping `retained`, without tiers.
inline tandem::v1::PruningPlan HandBuiltPlan(const std::vector<int>& retained = {0, 1, 2, 3}) {
  tandem::v1::PruningPlan plan;
  plan.set_num_layers(1);
  plan.set_num_experts(4);
  plan.set_criterion(tandem::v1::PRUNING_CRITERION_FREQUENCY);
  auto* layer = plan.add_layers();
  for (int e : retained) layer->add_retained_experts(e);
  return plan;
}

}  // namespace tandem::moe::testing
