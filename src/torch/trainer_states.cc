// pskv::Trainer's optimizer configuration and states: the learning rate, changed with
// the states kept, and states files (docs/coming-from-ddp.md, checkpoints).
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "pskv/error.h"
#include "pskv/optimizer.h"
#include "trainer_impl.h"

namespace pskv {

double Trainer::learning_rate() const {
  return impl_->cfg.learning_rate;
}

bool Trainer::update_on_kvstore() const {
  return impl_->uok;
}

const OptimizerConfig& Trainer::optimizer_config() const {
  return impl_->cfg;
}

void Trainer::SetLearningRate(double lr) {
  Impl& m = *impl_;
  OptimizerConfig next = m.cfg;
  next.learning_rate = lr;
  next.Validate();
  if (!m.uok) {
    auto fresh = std::make_unique<Optimizer>(next);
    fresh->LoadStates(m.local_opt->SaveStates());
    m.local_opt = std::move(fresh);
  } else {
    // SetOptimizer starts from fresh states: carry them over through a states file
    // (rank 0 writes and reads it).
    char path[] = "/tmp/pskv_states_XXXXXX";
    int fd = ::mkstemp(path);
    if (fd < 0) throw IOError("cannot create a temporary file for the optimizer states");
    ::close(fd);
    try {
      m.kv->SaveOptimizerStates(path);
      m.kv->SetOptimizer(next);
      m.kv->LoadOptimizerStates(path);
      // The store's load is rank 0's alone: no worker may push before it is done.
      m.kv->Barrier();
    } catch (...) {
      std::remove(path);
      throw;
    }
    std::remove(path);
  }
  m.cfg = next;
}

void Trainer::SaveStates(const std::string& fname) {
  Impl& m = *impl_;
  if (m.uok) {
    m.kv->SaveOptimizerStates(fname, /*dump_optimizer=*/true);
    // Rank 0 writes the file: when this returns on any worker, the file is complete.
    m.kv->Barrier();
  } else {
    WriteOptimizerStatesFile(fname, m.local_opt->SaveStates(/*dump_optimizer=*/true));
  }
}

void Trainer::LoadStates(const std::string& fname) {
  Impl& m = *impl_;
  const std::optional<OptimizerConfig> saved = ReadDumpedOptimizerConfig(fname);
  if (m.uok) {
    m.kv->LoadOptimizerStates(fname);
    // Rank 0 loads for the store: no worker may push before the states are in.
    m.kv->Barrier();
  } else {
    m.local_opt->LoadStates(ReadOptimizerStatesFile(fname));
  }
  if (saved) m.cfg = *saved;
}

}  // namespace pskv
