#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <set>
#include <stdexcept>
#include <string_view>

#include "common/env_table.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"
#include "support/env_guard.h"

using namespace pskv;

using test::EnvGuard;

TEST(Options, DefaultsMatchMXNet) {
  Options o;
  EXPECT_EQ(o.bigarray_bound, 1000000);
  EXPECT_EQ(o.reduction_threads, 4);
  EXPECT_FALSE(o.resend);
  EXPECT_EQ(o.resend_timeout.count(), 1000);
  EXPECT_EQ(o.spin_us, 100);
  EXPECT_TRUE(o.tcp_direct);
}

TEST(Options, ReadsTheEnvironmentContract) {
  EnvGuard g;
  g.Set("DMLC_ROLE", "server");
  g.Set("DMLC_PS_ROOT_URI", "127.0.0.1");
  g.Set("DMLC_PS_ROOT_PORT", "9091");
  g.Set("DMLC_NUM_SERVER", "2");
  g.Set("DMLC_NUM_WORKER", "3");
  g.Set("PS_VERBOSE", "2");
  g.Set("PS_RESEND", "1");
  g.Set("PS_RESEND_TIMEOUT", "250");
  g.Set("PS_HEARTBEAT_INTERVAL", "0.5");
  g.Set("PS_HEARTBEAT_TIMEOUT", "3");
  g.Set("MXNET_KVSTORE_BIGARRAY_BOUND", "1000");
  g.Set("MXNET_KVSTORE_REDUCTION_NTHREADS", "2");
  g.Set("PSKV_SERVER_THREADS", "3");
  g.Set("PSKV_FUSION_KEY_BYTES", "1024");
  g.Set("PSKV_FUSION_BYTES", "8192");
  g.Set("PSKV_WIRE_CHUNK_BYTES", "65536");
  g.Set("PSKV_WIRE_WINDOW_BYTES", "0");
  g.Set("PSKV_SPIN_US", "0");
  g.Set("PSKV_TCP_DIRECT", "0");
  Options o = Options::FromEnv();
  EXPECT_EQ(o.role, Role::kServer);
  EXPECT_TRUE(o.role_set);
  EXPECT_EQ(o.root_uri, "127.0.0.1");
  EXPECT_EQ(o.root_port, 9091);
  EXPECT_EQ(o.num_servers, 2);
  EXPECT_EQ(o.num_workers, 3);
  EXPECT_EQ(o.verbose, 2);
  EXPECT_TRUE(o.resend);
  EXPECT_EQ(o.resend_timeout.count(), 250);
  EXPECT_EQ(o.heartbeat_interval.count(), 500);
  EXPECT_EQ(o.heartbeat_timeout.count(), 3000);
  EXPECT_EQ(o.bigarray_bound, 1000);
  EXPECT_EQ(o.reduction_threads, 2);
  EXPECT_EQ(o.server_threads, 3);
  EXPECT_EQ(o.fusion_key_bytes, 1024);
  EXPECT_EQ(o.fusion_bytes, 8192);
  EXPECT_EQ(o.wire_chunk_bytes, 65536);
  EXPECT_EQ(o.wire_window_bytes, 0);
  EXPECT_EQ(o.spin_us, 0);
  EXPECT_FALSE(o.tcp_direct);
  EXPECT_NO_THROW(o.ValidateForDistributed());
}

TEST(Options, MalformedValueNamesTheVariable) {
  EnvGuard g;
  g.Set("DMLC_NUM_WORKER", "two");
  try {
    Options::FromEnv();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DMLC_NUM_WORKER"), std::string::npos);
  }
}

TEST(Options, BadRoleAndRanges) {
  {
    EnvGuard g;
    g.Set("DMLC_ROLE", "wroker");
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  {
    EnvGuard g;
    g.Set("DMLC_PS_ROOT_PORT", "70000");
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  {
    EnvGuard g;
    g.Set("MXNET_KVSTORE_REDUCTION_NTHREADS", "0");
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  {
    EnvGuard g;
    g.Set("PSKV_WIRE_WINDOW_BYTES", "-1");
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  {
    EnvGuard g;
    g.Set("PSKV_SPIN_US", "20000");  // above 10 ms: a typo, not a choice
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
}

TEST(Options, MissingDistributedVariableIsNamed) {
  Options o;
  try {
    o.ValidateForDistributed();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DMLC_PS_ROOT_URI"), std::string::npos);
  }
  o.root_uri = "127.0.0.1";
  o.root_port = 1;
  o.num_servers = 1;
  try {
    o.ValidateForDistributed();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DMLC_NUM_WORKER"), std::string::npos);
  }
}

TEST(Options, LinkRateLearnedByDefaultZeroIsOff) {
  // kvstore/distributed/link_pacing.h: unset or 1, the rate is learned (< 0); 0, nothing
  // is paced; a stated rate paces at it; the workers' layout check says which.
  EXPECT_LT(Options().link_rate, 0);
  EXPECT_LT(Options::FromEnv().link_rate, 0);
  EXPECT_NE(WorkerLayoutSettings(Options()).find("PSKV_LINK_RATE=learned"), std::string::npos);
  {
    EnvGuard g;
    g.Set("PSKV_LINK_RATE", "0");
    EXPECT_EQ(Options::FromEnv().link_rate, 0);
    EXPECT_NE(WorkerLayoutSettings(Options::FromEnv()).find("PSKV_LINK_RATE=off"),
              std::string::npos);
  }
  {
    EnvGuard g;
    g.Set("PSKV_LINK_RATE", "12500000");
    EXPECT_EQ(Options::FromEnv().link_rate, 12'500'000);
    EXPECT_NE(WorkerLayoutSettings(Options::FromEnv()).find("PSKV_LINK_RATE=on"),
              std::string::npos);
  }
  EnvGuard g;
  g.Set("PSKV_LINK_RATE", "1");
  EXPECT_LT(Options::FromEnv().link_rate, 0);
  EXPECT_NE(WorkerLayoutSettings(Options::FromEnv()).find("PSKV_LINK_RATE=learned"),
            std::string::npos);
}

TEST(Options, ServerWeightsAreAutoEvenOrOneWholeNumberPerServer) {
  EXPECT_EQ(Options().server_weights, "auto");
  for (const char* ok : {"auto", "even", "balanced", "1,0,3", "7", "0,1000000"}) {
    EnvGuard g;
    g.Set("PSKV_SERVER_WEIGHTS", ok);
    EXPECT_EQ(Options::FromEnv().server_weights, ok);
  }
  for (const char* bad : {"Auto", "1,,2", "1,-2", "0,0", "1.5,1", "1,2,", "1000001", " 1"}) {
    EnvGuard g;
    g.Set("PSKV_SERVER_WEIGHTS", bad);
    try {
      Options::FromEnv();
      ADD_FAILURE() << bad << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("PSKV_SERVER_WEIGHTS"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(ParseServerWeights("1,0,3"), (std::vector<int64_t>{1, 0, 3}));
  // One weight per server: checked where the job's size is known.
  Options o;
  o.root_uri = "127.0.0.1";
  o.root_port = 1;
  o.num_servers = 3;
  o.num_workers = 1;
  o.server_weights = "1,1,3";
  EXPECT_NO_THROW(o.ValidateForDistributed());
  for (const char* keyword : {"auto", "even", "balanced"}) {
    o.server_weights = keyword;
    EXPECT_NO_THROW(o.ValidateForDistributed()) << keyword;
  }
  o.server_weights = "1,3";
  try {
    o.ValidateForDistributed();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("2 weights for 3 servers"), std::string::npos) << e.what();
  }
}

TEST(Options, JobSecretFromTheEnvironmentOrAPrivateFile) {
  {
    EnvGuard g;
    g.Set("PSKV_JOB_SECRET", "abcdefghijklmnop");
    g.Set("PSKV_ENCRYPT", "1");
    Options o = Options::FromEnv();
    EXPECT_EQ(o.job_secret, "abcdefghijklmnop");
    EXPECT_TRUE(o.encrypt);
    g.Set("PSKV_JOB_SECRET", "abc");  // too short to resist offline guessing
    try {
      Options::FromEnv();
      ADD_FAILURE() << "a 3-character secret must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("at least 16"), std::string::npos) << e.what();
    }
  }
  char path[] = "/tmp/pskv-secret-test-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "from-file-0123456789\n", 21), 21);
  ::close(fd);
  {
    EnvGuard g;
    g.Set("PSKV_JOB_SECRET_FILE", path);
    ::chmod(path, 0600);
    EXPECT_EQ(Options::FromEnv().job_secret, "from-file-0123456789");  // trailing newline dropped
    ::chmod(path, 0644);  // readable by others: refused, naming the fix
    try {
      Options::FromEnv();
      ADD_FAILURE() << "a world-readable secret file must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
    }
    ::chmod(path, 0600);
    g.Set("PSKV_JOB_SECRET", "abcdefghijklmnop");  // both set: ambiguous
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  ::unlink(path);
  {
    EnvGuard g;
    g.Set("PSKV_JOB_SECRET_FILE", "/nonexistent/pskv-secret");
    EXPECT_THROW(Options::FromEnv(), ConfigError);
  }
  Options o;
  o.root_uri = "127.0.0.1";
  o.root_port = 1;
  o.num_servers = o.num_workers = 1;
  o.encrypt = true;  // encryption is keyed from the secret: needs one
  EXPECT_THROW(o.ValidateForDistributed(), ConfigError);
}

// The library never exits the process: a server-role Create is a UsageError that
// says what to do; RunServerRoleIfAsked is the explicit way to run the role.
TEST(Roles, CreateInAServerProcessIsAnErrorNotAnExit) {
  Options o;
  o.role = Role::kServer;
  o.role_set = true;
  o.root_uri = "127.0.0.1";
  o.root_port = 1;
  o.num_servers = o.num_workers = 1;
  try {
    KVStore::Create("dist_sync", o);
    ADD_FAILURE() << "Create must not run or exit a server here";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RunServerRoleIfAsked"), std::string::npos) << e.what();
  }
  Options w = o;
  w.role = Role::kWorker;
  EXPECT_FALSE(RunServerRoleIfAsked(w).has_value());
  EXPECT_FALSE(RunServerRoleIfAsked(Options{}).has_value());
}

TEST(Options, RoundIntegrityVariables) {
  Options d;
  EXPECT_FALSE(d.strict_rounds);
  EXPECT_EQ(d.stall_warning.count(), 60000);
  EXPECT_FALSE(d.sum_in_arrival_order);
  {
    EnvGuard g;
    g.Set("PSKV_STRICT_ROUNDS", "1");
    g.Set("PSKV_STALL_WARNING", "2.5");
    g.Set("PSKV_SUM_ORDER", "arrival");
    Options o = Options::FromEnv();
    EXPECT_TRUE(o.strict_rounds);
    EXPECT_EQ(o.stall_warning.count(), 2500);
    EXPECT_TRUE(o.sum_in_arrival_order);
  }
  for (auto [k, v] : {std::pair<const char*, const char*>{"PSKV_STRICT_ROUNDS", "yes"},
                      {"PSKV_STALL_WARNING", "-1"},
                      {"PSKV_SUM_ORDER", "random"}}) {
    EnvGuard g;
    g.Set(k, v);
    try {
      Options::FromEnv();
      ADD_FAILURE() << k << "=" << v << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(k), std::string::npos) << e.what();
    }
  }
}

// ---- the table of environment variables (common/env_table.h)

namespace {
// A value of `v` that FromEnv accepts.
std::string ValidSample(const EnvVar& v) {
  const std::string name = v.name;
  if (name == "PSKV_LOG_LEVEL") return "warn,ps=info";
  if (name == "PSKV_JOB_SECRET") return "a-secret-of-enough-length";
  if (name == "PSKV_SERVER_WEIGHTS") return "1,0,3";
  if (name == "PSKV_STATUS") return "stderr";
  switch (v.type) {
    case EnvType::kChoice: {
      const std::string_view c = v.choices;
      return std::string(c.substr(0, c.find('|')));
    }
    case EnvType::kBool:
    case EnvType::kSeconds:
      return "1";
    case EnvType::kInt:
    case EnvType::kMillis:
      return std::to_string(v.hi);  // the bound itself is valid (4096..1 GiB: a power of two)
    default:
      return "x";
  }
}
}  // namespace

TEST(EnvTable, EveryEntryIsComplete) {
  std::set<std::string> seen;
  for (const EnvVar& v : EnvVars()) {
    EXPECT_TRUE(seen.insert(v.name).second) << v.name << " twice";
    EXPECT_NE(std::string(v.doc), "") << v.name;
    EXPECT_NE(std::string(v.default_text), "") << v.name;
    EXPECT_EQ(FindEnvVar(v.name), &v);
    const bool numeric =
        v.type == EnvType::kInt || v.type == EnvType::kMillis || v.type == EnvType::kSeconds;
    if (numeric) {
      EXPECT_LE(v.lo, v.hi) << v.name;
    }
    EXPECT_EQ(v.type == EnvType::kChoice, *v.choices != '\0') << v.name;
    // Every variable pskv reads is parsed into Options by its entry.
    if (v.type == EnvType::kForwarded) {
      EXPECT_EQ(v.apply, nullptr) << v.name;
    }
  }
  EXPECT_EQ(FindEnvVar("PSKV_NO_SUCH_VARIABLE"), nullptr);
}

TEST(EnvTable, FromEnvAcceptsEveryEntrysValidValueAndRejectsBadOnesNamingIt) {
  for (const EnvVar& v : EnvVars()) {
    if (!v.apply || std::string(v.name) == "PSKV_JOB_SECRET_FILE") continue;  // below
    {
      EnvGuard g;
      g.Set(v.name, ValidSample(v));
      EXPECT_NO_THROW(Options::FromEnv()) << v.name << "=" << ValidSample(v);
    }
    std::vector<std::string> bad;
    if (v.type == EnvType::kChoice) bad.push_back("not-a-choice");
    if (std::string(v.name) == "PSKV_STATUS") bad = {"fd:1", "file:/tmp/status"};
    if (v.type == EnvType::kInt || v.type == EnvType::kMillis || v.type == EnvType::kBool ||
        v.type == EnvType::kSeconds) {
      bad.push_back("seven");
      if (v.hi < INT64_MAX) bad.push_back(std::to_string(v.hi + 1));
      if (v.lo > INT64_MIN) bad.push_back(std::to_string(v.lo - 1));
    }
    for (auto& b : bad) {
      EnvGuard g;
      g.Set(v.name, b);
      try {
        Options::FromEnv();
        ADD_FAILURE() << v.name << "=" << b << " accepted";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(v.name), std::string::npos) << e.what();
      }
    }
  }
}

// The library's test hooks are fail points installed by tests (ps/fail_points.h,
// tests/ps/test_fail_points.cc), not variables: the kTest rows left are no Options.
TEST(EnvTable, TestRowsAreNoOptions) {
  for (const EnvVar& v : EnvVars()) {
    EXPECT_NE(std::string(v.name).rfind("PSKV_TEST_", 0), 0u) << v.name;
    if (v.scope == EnvScope::kTest) {
      EXPECT_EQ(v.apply, nullptr) << v.name << ": a test variable, not an Option";
    }
  }
}

TEST(EnvTable, EnvValueReadsOnlyVariablesOfTheTable) {
  EnvGuard g;
  g.Set("PSKV_SPIN_US", "7");
  EXPECT_STREQ(EnvValue("PSKV_SPIN_US"), "7");
  g.Set("PSKV_SPIN_US", "");
  EXPECT_EQ(EnvValue("PSKV_SPIN_US"), nullptr);  // empty is unset
  EXPECT_THROW(EnvValue("PSKV_NOT_IN_THE_TABLE"), std::logic_error);
}

TEST(EnvTable, UpdateOnKVStoreIsReadIntoOptions) {
  EXPECT_FALSE(Options{}.update_on_kvstore.has_value());
  EnvGuard g;
  g.Set("MXNET_UPDATE_ON_KVSTORE", "0");
  EXPECT_EQ(Options::FromEnv().update_on_kvstore, std::optional<bool>(false));
  g.Set("MXNET_UPDATE_ON_KVSTORE", "1");
  EXPECT_EQ(Options::FromEnv().update_on_kvstore, std::optional<bool>(true));
}

// Issue 42, hole 8: PSKV_REPLICAS that the servers cannot honour is a ConfigError at
// start, on every node (Node and KVStore::Create validate their options), instead of a
// job that runs unreplicated (one server) or with fewer copies (R > S - 1) silently.
TEST(Options, ReplicasTheServersCannotHoldAreAnErrorAtStart) {
  Options o;
  o.root_uri = "127.0.0.1";
  o.root_port = 1;
  o.num_workers = 1;
  auto message = [&](int servers, int replicas) -> std::string {
    o.num_servers = servers;
    o.replicas = replicas;
    try {
      o.ValidateForDistributed();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(1, 0), "");
  EXPECT_EQ(message(2, 1), "");
  EXPECT_EQ(message(3, 2), "");
  const std::string one = message(1, 1);
  EXPECT_NE(one.find("PSKV_REPLICAS=1 needs at least 2 servers"), std::string::npos) << one;
  EXPECT_NE(one.find("PSKV_REPLICAS=0"), std::string::npos) << one;
  const std::string many = message(3, 3);
  EXPECT_NE(many.find("at most 2"), std::string::npos) << many;
  EXPECT_NE(message(2, 2).find("DMLC_NUM_SERVER=2"), std::string::npos);
  // A worker's store refuses to start (no scheduler is contacted first).
  o.num_servers = 1;
  o.replicas = 1;
  o.role = Role::kWorker;
  o.role_set = true;
  EXPECT_THROW(KVStore::Create("dist_sync", o), ConfigError);
}
