// A small tour of the single-machine KVStore: four "devices" push gradients,
// the store runs SGD, every device pulls the new weights.
#include <cmath>
#include <iostream>

#include "pskv/kvstore.h"

int main() {
  using namespace pskv;
  auto kv = KVStore::Create("device");
  kv->SetOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}}));
  NDArray w({2, 3});
  w.Fill(1.0);
  kv->Init("fc1_weight", w);
  std::vector<NDArray> grads, weights;
  for (int d = 0; d < 4; ++d) {
    NDArray g({2, 3});
    g.Fill(0.25 * (d + 1));  // device d's gradient
    grads.push_back(g);
    weights.emplace_back(Shape{2, 3});
  }
  for (int step = 0; step < 3; ++step) {
    kv->Push("fc1_weight", grads);  // summed: 2.5 per element
    kv->Pull("fc1_weight", weights);
  }
  kv->WaitAll();
  std::cout << "kvstore type " << kv->Type() << ": after 3 SGD steps every device holds "
            << weights[3].At(0) << " (expected " << 1.0 - 3 * 0.1 * 2.5 << ")\n";
  return std::abs(weights[3].At(0) - (1.0 - 3 * 0.1 * 2.5)) < 1e-5 ? 0 : 1;
}
