// The Trainer semantics both front ends call (include/pskv/trainer_policy.h): where
// the optimizer runs, the loss scale, the optimizer configuration by key.
#include <gtest/gtest.h>

#include "pskv/error.h"
#include "pskv/trainer_policy.h"

using namespace pskv;

namespace {
UpdatePlacement Given(const std::string& type) {
  UpdatePlacement p;
  p.store_type = type;
  return p;
}
}  // namespace

TEST(TrainerPolicy, UpdateOnKVStoreFollowsMxnet) {
  // a given store: MXNET_UPDATE_ON_KVSTORE decides
  EXPECT_TRUE(ResolveUpdateOnKVStore(Given("local")));
  EXPECT_TRUE(ResolveUpdateOnKVStore(Given("dist_sync")));
  auto off = Given("dist_sync");
  off.env_default = false;
  EXPECT_FALSE(ResolveUpdateOnKVStore(off));
  // a store made from a name for one device without dist: MXNet uses no store
  auto named = Given("local");
  named.store_from_name = true;
  EXPECT_FALSE(ResolveUpdateOnKVStore(named));
  named.devices = 2;
  EXPECT_TRUE(ResolveUpdateOnKVStore(named));
  named.largest_param = (int64_t{16} << 20) + 1;  // big "local" from a name: local updates
  EXPECT_FALSE(ResolveUpdateOnKVStore(named));
  auto given_big = Given("local");
  given_big.largest_param = named.largest_param;  // only for a store made from a name
  EXPECT_TRUE(ResolveUpdateOnKVStore(given_big));
  // async: true, and false is refused
  auto async = Given("dist_async");
  async.env_default = false;
  EXPECT_TRUE(ResolveUpdateOnKVStore(async));
  async.requested = false;
  EXPECT_THROW(ResolveUpdateOnKVStore(async), UsageError);
  // the caller's choice wins otherwise
  auto asked = Given("dist_sync");
  asked.requested = false;
  EXPECT_FALSE(ResolveUpdateOnKVStore(asked));
  // sparse parameters: the store holds the table
  auto sparse = Given("local");
  sparse.env_default = false;
  sparse.sparse_params = true;
  EXPECT_TRUE(ResolveUpdateOnKVStore(sparse));
  sparse.requested = false;
  EXPECT_THROW(ResolveUpdateOnKVStore(sparse), UsageError);
}

TEST(TrainerPolicy, LossScale) {
  LossScale mean(LossReduction::kMean, 0, 2, 2);
  EXPECT_EQ(mean.scale(), 0.25);
  EXPECT_EQ(mean.shipped(), 0.25);
  EXPECT_EQ(mean.Ratio(0), 1.0);
  EXPECT_THROW(mean.Ratio(4), UsageError);        // already means
  LossScale sum(LossReduction::kUnset, 8, 2, 1);  // a global batch means kSum
  EXPECT_EQ(sum.reduction(), LossReduction::kSum);
  EXPECT_EQ(sum.shipped(), 0.125);
  EXPECT_EQ(sum.Ratio(0), 1.0);
  EXPECT_EQ(sum.Ratio(16), 0.5);  // this step's batch: 1/16 of what the optimizer applies 1/8 of
  LossScale gluon(LossReduction::kUnset, 0, 2, 1);
  EXPECT_EQ(gluon.scale(), 0.0);
  EXPECT_EQ(gluon.shipped(), 1.0);
  EXPECT_EQ(gluon.Ratio(4), 0.25);
  EXPECT_THROW(gluon.Ratio(0), UsageError);  // the scale is unknown
  EXPECT_THROW(gluon.Ratio(-1), InvalidArgument);
  EXPECT_THROW(LossScale(LossReduction::kMean, 4, 1, 1), InvalidArgument);
  EXPECT_THROW(LossScale(LossReduction::kSum, -1, 1, 1), InvalidArgument);
}

TEST(TrainerPolicy, OptimizerConfigByKey) {
  auto user = OptimizerConfig::FromParams("sgd", {{"rescale_grad", "0.5"}, {"lr_mult", "0:9"}});
  auto cfg = TrainerOptimizerConfig(user, 0.25, 10, 3, {{0, 2.0}}, {{2, 0.5}}, 2);
  EXPECT_EQ(cfg.rescale_grad, 0.125);  // multiplied, not replaced
  EXPECT_EQ(cfg.lr_mult,
            (std::map<int64_t, double>{{10, 2.0}}));  // by key; the user's by-key ones go
  EXPECT_EQ(cfg.wd_mult, (std::map<int64_t, double>{{12, 0.5}}));
  EXPECT_EQ(cfg.sum_keys, (std::set<int64_t>{13, 14}));  // the buffers follow the parameters
  EXPECT_THROW(TrainerOptimizerConfig(user, 1, 0, 3, {{3, 2.0}}, {}, 0), InvalidArgument);
}
