// One scenario of tests/trainer_scenarios.json with the libtorch pskv::Trainer;
// tests/python/trainer_scenario.py is its Python twin and must stay line for line
// equivalent (tests/python/test_trainer_scenarios.py compares their reports).
//
//   trainer_scenario SCENARIO_FILE OUT_DIR
//
// SCENARIO_FILE: `name=value` lines written by test_trainer_scenarios.py (one
// scenario of the table, flattened). Writes OUT_DIR/cpp<rank>.json.
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/torch.h"

namespace {

std::map<std::string, std::string> ReadScenario(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw pskv::IOError("cannot read " + path);
  std::map<std::string, std::string> s;
  std::string line;
  while (std::getline(f, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) s[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return s;
}

std::vector<std::string> Split(const std::string& v, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::map<size_t, double> Mults(const std::string& v) {
  std::map<size_t, double> m;
  for (auto& item : Split(v, ',')) {
    const auto colon = item.find(':');
    m[std::stoul(item.substr(0, colon))] = std::stod(item.substr(colon + 1));
  }
  return m;
}

// The generators of the scenario table (trainer_scenario.py computes the same
// values: float64 arithmetic, then float32).
torch::Tensor Init(std::vector<int64_t> shape, int i, int rank) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v;
  for (int64_t j = 0; j < n; ++j)
    v.push_back(static_cast<float>(0.5 - 0.0625 * static_cast<double>((7 * j + 3 * i) % 11) +
                                   static_cast<double>(rank)));
  return torch::tensor(v).reshape(shape);
}

torch::Tensor Grad(int64_t n, int i, int step, int rank) {
  std::vector<float> v;
  for (int64_t j = 0; j < n; ++j)
    v.push_back(static_cast<float>(static_cast<double>(j % 5 - 2) * 0.25 +
                                   0.125 * (step + 1) * (rank + 1) * (i + 1)));
  return torch::tensor(v);
}

std::string Hex(const torch::Tensor& t) {
  auto c = t.detach().contiguous();
  const auto* b = static_cast<const unsigned char*>(c.data_ptr());
  std::string out;
  char buf[3];
  for (size_t k = 0; k < c.nbytes(); ++k) {
    std::snprintf(buf, sizeof buf, "%02x", b[k]);
    out += buf;
  }
  return out;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '\n')
      out += "\\n";
    else if (ch == '"' || ch == '\\')
      out += std::string("\\") + ch;
    else
      out += ch;
  }
  return out + "\"";
}

int Run(const std::map<std::string, std::string>& sc, const std::string& out_dir) {
  auto kv = pskv::KVStore::Create(sc.at("store"));
  const int rank = kv->Rank();
  const bool sparse = sc.at("sparse") == "1";
  std::vector<torch::Tensor> params{Init({4, 3}, 0, rank).requires_grad_(true),
                                    Init({3}, 1, rank).requires_grad_(true)};
  if (sparse) params.push_back(Init({6, 2}, 2, rank).requires_grad_(true));
  auto buffer = torch::zeros({2});

  pskv::TrainerOptions o;
  std::map<std::string, std::string> op;
  for (auto& [k, v] : sc)
    if (k.rfind("opt.", 0) == 0) op[k.substr(4)] = v;
  o.optimizer = pskv::OptimizerConfig::FromParams(sc.at("optimizer"), op);
  if (sc.at("uok") != "none") o.update_on_kvstore = sc.at("uok") == "1";
  if (sc.at("loss_reduction") == "mean") o.loss_reduction = pskv::LossReduction::kMean;
  if (sc.at("loss_reduction") == "sum") o.loss_reduction = pskv::LossReduction::kSum;
  o.global_batch_size = std::stoll(sc.at("global_batch_size"));
  o.lr_mult = Mults(sc.at("lr_mult"));
  o.wd_mult = Mults(sc.at("wd_mult"));
  o.push_in_backward = sc.at("push_in_backward") == "1";
  if (sparse) o.sparse_params.insert(2);
  if (sc.at("buffers") == "1") o.buffers = {buffer};
  pskv::Trainer t(params, kv.get(), o);

  const int64_t batch = std::stoll(sc.at("batch_size"));
  int step = 0;
  for (const auto& action : Split(sc.at("actions"), ',')) {
    if (action == "step") {
      {
        torch::NoGradGuard no_grad;
        for (int64_t j = 0; j < 2; ++j) buffer[j] = static_cast<float>(step * 10 + rank + j);
      }
      auto loss = (params[0] * Grad(12, 0, step, rank).reshape({4, 3})).sum() +
                  (params[1] * Grad(3, 1, step, rank)).sum();
      if (sparse) {
        auto ids = torch::tensor({static_cast<int64_t>((step + rank) % 6),
                                  static_cast<int64_t>((step + 2 * rank + 3) % 6)});
        namespace F = torch::nn::functional;
        auto rows = F::embedding(ids, params[2], F::EmbeddingFuncOptions().sparse(true));
        loss = loss + (rows * Grad(4, 2, step, rank).reshape({2, 2})).sum();
      }
      loss.backward();
      t.Step(batch);
      ++step;
    } else if (action.rfind("set_lr:", 0) == 0) {
      t.SetLearningRate(std::stod(action.substr(7)));
    } else if (action == "save") {
      t.SaveStates(sc.at("states"));
    } else if (action == "load") {
      t.LoadStates(sc.at("states"));
    } else {
      throw pskv::InvalidArgument("unknown action " + action);
    }
  }
  std::ofstream f(out_dir + "/cpp" + std::to_string(rank) + ".json");
  f << "{\"update_on_kvstore\": " << (t.update_on_kvstore() ? "true" : "false")
    << ", \"learning_rate\": " << std::setprecision(17) << t.learning_rate()
    << ", \"config\": " << Quote(t.optimizer_config().Serialize()) << ", \"weights\": [";
  for (size_t i = 0; i < params.size(); ++i) f << (i ? ", " : "") << Quote(Hex(params[i]));
  f << "], \"buffer\": " << Quote(Hex(buffer)) << "}\n";
  return f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: trainer_scenario SCENARIO_FILE OUT_DIR\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    return Run(ReadScenario(argv[1]), argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_scenario: %s\n", e.what());
    return 1;
  }
}
