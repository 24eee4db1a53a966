// Distributed KVStore: real processes on 127.0.0.1 started by pskv-launch, running
// tests/distributed/dist_worker.cc scenarios; each test asserts the launcher's exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

namespace {

// A job whose `extra` sets PSKV_TEST_* fail points (tests/support/env_fail_points.h)
// runs pskv-test-server for its scheduler and servers, which installs them.
int Launch(int workers, int servers, const std::string& scenario, const std::string& extra = "",
           int rounds = 4) {
  const std::string server = extra.find("PSKV_TEST_") != std::string::npos
                                 ? std::string(" --server-command 'exec ") + TEST_SERVER + "'"
                                 : "";
  std::string cmd = std::string(PSKV_LAUNCH) + " -n " + std::to_string(workers) + " -s " +
                    std::to_string(servers) + server +
                    " --timeout 150 --env MXNET_KVSTORE_BIGARRAY_BOUND=1000 " + extra + " -- " +
                    DIST_WORKER + " " + scenario + " " + std::to_string(rounds);
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A job of tests/distributed/embedding_worker.cc (dynamic embedding tables).
int LaunchEmbedding(int workers, int servers, const std::string& scenario, int rounds,
                    const std::string& extra = "") {
  const std::string cmd = std::string(PSKV_LAUNCH) + " -n " + std::to_string(workers) + " -s " +
                          std::to_string(servers) + " --timeout 60 " + extra + " -- " +
                          EMBEDDING_WORKER + " " + scenario + " " + std::to_string(rounds);
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

// Dynamic embedding tables (issue 41): 2 workers x 2 servers pushing Zipf ids give
// the rows of in-process embedding::Tables pushed the same updates in the same order,
// bit for bit, with admission (exact and counting Bloom), TTL and capacity eviction
// deciding the same rows.
TEST(DistKVStore, EmbeddingSync2Workers2ServersEqualsOneTable) {
  EXPECT_EQ(LaunchEmbedding(2, 2, "sync", 12), 0);
}
// dist_async: each push applied as it arrives (one worker: the same references).
TEST(DistKVStore, EmbeddingAsync1Worker2ServersEqualsOneTable) {
  EXPECT_EQ(LaunchEmbedding(1, 2, "async", 12), 0);
}
// Typed errors naming the fix; a push over a server's budget fails on every worker
// and changes nothing.
TEST(DistKVStore, EmbeddingMisuseErrors) {
  EXPECT_EQ(LaunchEmbedding(2, 2, "misuse", 1), 0);
}
// What the tables' replication does not cover yet (PSKV_REPLICAS >= 1 and a restore
// of replicated tables are covered: test_failover_embedding.cc): spare servers.
// Refused on every worker, naming the setting.
TEST(DistKVStore, EmbeddingRefusedWithSpares) {
  EXPECT_EQ(LaunchEmbedding(2, 2, "replicas", 1, "--env PSKV_REPLICAS=1 --spare-servers 1"), 0);
}

TEST(DistKVStore, Sync4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "sync"), 0);
}
TEST(DistKVStore, SyncDevice2Workers2Servers) {
  EXPECT_EQ(Launch(2, 2, "sync_device"), 0);
}
TEST(DistKVStore, Sync7Workers7Servers) {
  EXPECT_EQ(Launch(7, 7, "sync", "", 2), 0);
}
TEST(DistKVStore, StringKeys) {
  EXPECT_EQ(Launch(4, 2, "string_keys"), 0);
}
TEST(DistKVStore, Async4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "async", "", 10), 0);
}
TEST(DistKVStore, AsyncDevice) {
  EXPECT_EQ(Launch(2, 1, "async_device", "", 5), 0);
}
TEST(DistKVStore, Async7Workers7Servers) {
  EXPECT_EQ(Launch(7, 7, "async", "", 3), 0);
}
TEST(DistKVStore, TwoBitCompression) {
  EXPECT_EQ(Launch(4, 2, "compression"), 0);
}
TEST(DistKVStore, UpdateOnKVStoreFalseSums) {
  EXPECT_EQ(Launch(4, 2, "no_optimizer"), 0);
}
TEST(DistKVStore, MultiPrecision) {
  EXPECT_EQ(Launch(2, 2, "multi_precision"), 0);
}
TEST(DistKVStore, MisuseErrors) {
  EXPECT_EQ(Launch(2, 2, "misuse"), 0);
}
TEST(DistKVStore, AsyncWithoutOptimizerIsAnError) {
  EXPECT_EQ(Launch(2, 1, "async_no_optimizer"), 0);
}
TEST(DistKVStore, UnequalPushCountsFailNamingTheWorker) {
  EXPECT_EQ(Launch(3, 2, "unequal", "", 3), 0);
}
TEST(DistKVStore, StringKeyOrderMismatchDetected) {
  EXPECT_EQ(Launch(2, 1, "string_order"), 0);
}
TEST(DistKVStore, OptimizerStatesSaveAndLoad) {
  EXPECT_EQ(Launch(2, 2, "states"), 0);
}
TEST(DistKVStore, InitShapeMismatchFailsEveryWorker) {
  EXPECT_EQ(Launch(2, 1, "shape_mismatch"), 0);
}

// row_sparse keys (issue 15): MXNet's dist_sync row_sparse checks with 4 workers and
// 2 servers (the big table sliced by row range over both), sums without optimizer,
// and dist_async.
TEST(DistKVStore, RowSparseSync4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "sparse_sync", "", 3), 0);
}
TEST(DistKVStore, RowSparseNoOptimizerSums) {
  EXPECT_EQ(Launch(4, 2, "sparse_no_optimizer", "", 3), 0);
}
TEST(DistKVStore, RowSparseAsync) {
  EXPECT_EQ(Launch(4, 2, "sparse_async", "", 5), 0);
}
// Servers with several threads (keys sharded over them, big values merged chunk-wise
// on the reducer's pool; pskv-launch gives a server 1 thread on a 2-core machine):
// the same scenarios, their values checked the same way.
const char* kThreads = "--env PSKV_SERVER_THREADS=3 --env MXNET_KVSTORE_REDUCTION_NTHREADS=3";
// The MXNet formula scenarios again, in other settings: servers with several threads,
// TCP only (co-located nodes talk through shared memory by default, PSKV_SHM=auto,
// so the tests above run over shm) through pskv's direct TCP connections
// (PSKV_TCP_DIRECT=1, the default), and TCP through ZeroMQ's sockets.
class DistKVStoreIn : public ::testing::TestWithParam<const char*> {};
TEST_P(DistKVStoreIn, Sync4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "sync", GetParam()), 0);
}
TEST_P(DistKVStoreIn, Async4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "async", GetParam(), 10), 0);
}
TEST_P(DistKVStoreIn, TwoBitCompression) {
  EXPECT_EQ(Launch(4, 2, "compression", GetParam()), 0);
}
TEST_P(DistKVStoreIn, UpdateOnKVStoreFalseSums) {
  EXPECT_EQ(Launch(4, 2, "no_optimizer", GetParam()), 0);
}
TEST_P(DistKVStoreIn, ManyKeysAndAChunkedKeySumInRankOrder) {
  EXPECT_EQ(Launch(4, 2, "many_keys", GetParam(), 3), 0);
}
// Fused messages and answers are gathered frames (transport.h): every transport
// writes their pieces (ZeroMQ packs them); sums stay bit for bit, in place too.
TEST_P(DistKVStoreIn, FusedSumsInRankOrder) {
  EXPECT_EQ(Launch(3, 2, "fused_sum", GetParam(), 4), 0);
}
TEST_P(DistKVStoreIn, FusedSmallKeys) {
  EXPECT_EQ(Launch(3, 2, "fused", GetParam(), 3), 0);
}
INSTANTIATE_TEST_SUITE_P(Settings, DistKVStoreIn,
                         ::testing::Values(kThreads, "--env PSKV_SHM=0 --env PSKV_TCP_DIRECT=1",
                                           "--env PSKV_SHM=0 --env PSKV_TCP_DIRECT=0"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.index == 0   ? "ServerThreads"
                                              : i.index == 1 ? "Tcp"
                                                             : "TcpThroughZeroMQ");
                         });
TEST(DistKVStoreServerThreads, MultiPrecision) {
  EXPECT_EQ(Launch(2, 2, "multi_precision", kThreads), 0);
}
TEST(DistKVStoreServerThreads, UnequalPushCountsFailNamingTheWorker) {
  EXPECT_EQ(Launch(3, 2, "unequal", kThreads, 3), 0);
}
TEST(DistKVStore, ManyKeysAndAChunkedKeySumInRankOrder) {
  EXPECT_EQ(Launch(4, 2, "many_keys", "", 3), 0);
}
// Fusion of small keys (one call): values with two inputs and two outputs per key,
// sliced keys in the same call, rank 0 issuing one call per key while the others
// fuse; async; and a fused push whose rounds cannot all complete fails (no hang).
TEST(DistKVStore, FusedSmallKeys) {
  EXPECT_EQ(Launch(3, 2, "fused", "", 3), 0);
}
// Fusion without an optimizer: rank-order sums bit for bit, three dtypes, keys
// initialised in descending order, several outputs, a fused pull (dist_worker.cc).
TEST(DistKVStore, FusedSumsInRankOrder) {
  EXPECT_EQ(Launch(3, 1, "fused_sum", "", 4), 0);
}
// A ring smaller than a fused message: its pieces stream through the ring in turns
// (the writer thread finishes what did not fit), so the workers' arrays and the
// server's values are read after the call that sent them returned.
TEST(DistKVStore, FusedSumsThroughASmallRing) {
  EXPECT_EQ(Launch(3, 1, "fused_sum", "--env PSKV_SHM_RING_BYTES=4096", 3), 0);
}
// Fusion groups of at most 4 KiB: a call's fused keys are one engine operation of
// several requests per server, which completes only when all of them are answered
// (the servers answer each request 10 ms late, so an operation that completed with
// its first answer would leave outputs unwritten).
TEST(DistKVStoreServerThreads, FusedSumsInRankOrderSeveralRequestsPerCall) {
  EXPECT_EQ(Launch(3, 2, "fused_sum",
                   std::string(kThreads) +
                       " --env PSKV_FUSION_BYTES=4096 --env-server PSKV_TEST_REPLY_DELAY=10",
                   3),
            0);
}
TEST(DistKVStore, AsyncFusedSmallKeys) {
  EXPECT_EQ(Launch(3, 2, "async_fused", kThreads, 5), 0);
}
TEST(DistKVStore, FusedPushWhoseRoundsCannotCompleteFails) {
  EXPECT_EQ(Launch(2, 1, "fused_unequal"), 0);
}
TEST(DistKVStoreServerThreads, FusedPushWhoseRoundsCannotCompleteFails) {
  EXPECT_EQ(Launch(3, 2, "fused_unequal", kThreads), 0);
}
TEST(DistKVStoreServerThreads, OptimizerStatesSaveAndLoad) {
  EXPECT_EQ(Launch(2, 2, "states", kThreads), 0);
}
TEST(DistKVStoreServerThreads, RowSparseSync4Workers2Servers) {
  EXPECT_EQ(Launch(4, 2, "sparse_sync", kThreads, 3), 0);
}
TEST(DistKVStoreServerThreads, RowSparseAsync) {
  EXPECT_EQ(Launch(4, 2, "sparse_async", kThreads, 5), 0);
}

// Priorities on the wire (issue 13, item 4): wire chunks and send scheduling.
const char* kTinyWindow = "--env PSKV_WIRE_CHUNK_BYTES=65536 --env PSKV_WIRE_WINDOW_BYTES=1";
TEST(DistKVStoreWire, HighPriorityKeyOvertakesABigLowPriorityOne) {
  EXPECT_EQ(Launch(1, 1, "priority_order",
                   std::string(kTinyWindow) +
                       " --env PSKV_TEST_REPLY_DELAY=5 --env PSKV_SERVER_THREADS=1"),
            0);
}
TEST(DistKVStoreWire, HighPriorityKeyOvertakesABigLowPriorityOneOverTcp) {
  EXPECT_EQ(
      Launch(1, 1, "priority_order",
             std::string(kTinyWindow) +
                 " --env PSKV_TEST_REPLY_DELAY=5 --env PSKV_SERVER_THREADS=1 --env PSKV_SHM=0"),
      0);
}
TEST(DistKVStoreWire, TinyWindowOppositeOrdersDoNotDeadlock) {
  EXPECT_EQ(Launch(3, 2, "wire_opposite", kTinyWindow, 3), 0);
}
// Credits travel like data under PS_RESEND; bogus credits (for messages never
// sent) from every node are dropped.
TEST(DistKVStoreWire, TinyWindowWithResendAndBogusCredits) {
  EXPECT_EQ(
      Launch(2, 1, "wire_opposite",
             std::string(kTinyWindow) + " --env PS_RESEND=1 --env PSKV_TEST_BOGUS_CREDITS=1", 3),
      0);
}
TEST(DistKVStoreWire, ChunkedValuesAreBitIdentical) {
  EXPECT_EQ(Launch(2, 2, "chunk_equal", "--env PSKV_WIRE_CHUNK_BYTES=4096", 4), 0);
}
TEST(DistKVStoreWire, ChunkedValuesAreBitIdenticalServerThreads) {
  EXPECT_EQ(
      Launch(2, 2, "chunk_equal", std::string("--env PSKV_WIRE_CHUNK_BYTES=4096 ") + kThreads, 4),
      0);
}
TEST(DistKVStoreWire, StatesSavedWithOtherChunksLoad) {
  EXPECT_EQ(Launch(2, 2, "states_other_chunks", "--env PSKV_WIRE_CHUNK_BYTES=4096"), 0);
}
// With PSKV_LINK_RATE a slice bigger than the chunk size travels in finer chunks, a
// server's consecutive ones sharing messages (dist_protocol.h, ChunkElems;
// worker/wire_shape.h, MessageBytes; on one host no connection is
// paced): values stay bit-identical, states saved without chunks load, and many keys
// with a chunked one sum in rank order over TCP.
const char* kFineChunks = "--env PSKV_WIRE_CHUNK_BYTES=32768 --env PSKV_LINK_RATE=1000000000";
TEST(DistKVStoreWire, FineChunksWithALinkRateAreBitIdentical) {
  EXPECT_EQ(Launch(2, 2, "chunk_equal", kFineChunks, 4), 0);
}
TEST(DistKVStoreWire, StatesSavedWithoutChunksLoadIntoFineChunks) {
  EXPECT_EQ(Launch(2, 2, "states_other_chunks", kFineChunks), 0);
}
TEST(DistKVStoreWire, FineChunksManyKeysSumInRankOrderOverTcp) {
  EXPECT_EQ(Launch(4, 2, "many_keys",
                   std::string(kFineChunks) + " --env PSKV_SHM=0 --env PSKV_TCP_DIRECT=1", 3),
            0);
}
// The scenarios above with every sliced key in chunks of 1 KiB (several per slice).
const char* kSmallChunks = "--env PSKV_WIRE_CHUNK_BYTES=1024 --env PSKV_WIRE_WINDOW_BYTES=1";
TEST(DistKVStoreWire, SyncSmallChunks) {
  EXPECT_EQ(Launch(4, 2, "sync", kSmallChunks), 0);
}
TEST(DistKVStoreWire, TwoBitCompressionSmallChunks) {
  EXPECT_EQ(Launch(4, 2, "compression", kSmallChunks), 0);
}
TEST(DistKVStoreWire, OptimizerStatesSaveAndLoadSmallChunks) {
  EXPECT_EQ(Launch(2, 2, "states", kSmallChunks), 0);
}
TEST(DistKVStoreWire, FusedSmallKeysSmallChunks) {
  EXPECT_EQ(Launch(3, 2, "fused", kSmallChunks, 3), 0);
}
TEST(DistKVStoreWire, MultiPrecisionSmallChunks) {
  EXPECT_EQ(Launch(2, 2, "multi_precision", kSmallChunks), 0);
}
TEST(DistKVStoreWire, AsyncSmallChunks) {
  EXPECT_EQ(Launch(4, 2, "async", kSmallChunks, 10), 0);
}

// Big keys split by PSKV_SERVER_WEIGHTS (uneven, one server holding none of them).
const char* kUneven = "--env PSKV_SERVER_WEIGHTS=3,0,1";
TEST(DistKVStorePlacement, UnevenSharesSumExactlyAndEqualTheEvenSplit) {
  EXPECT_EQ(Launch(3, 3, "placement", kUneven), 0);
}
TEST(DistKVStorePlacement, UnevenSharesInSmallChunks) {
  EXPECT_EQ(Launch(3, 3, "placement", std::string(kUneven) + " " + kSmallChunks, 3), 0);
}
TEST(DistKVStorePlacement, SyncFusionAndCompressionWithUnevenShares) {
  EXPECT_EQ(Launch(4, 3, "sync", "--env PSKV_SERVER_WEIGHTS=1,0,2"), 0);
  EXPECT_EQ(Launch(4, 3, "compression", "--env PSKV_SERVER_WEIGHTS=1,0,2"), 0);
  EXPECT_EQ(Launch(3, 3, "fused", "--env PSKV_SERVER_WEIGHTS=1,0,2", 3), 0);
  EXPECT_EQ(Launch(4, 2, "sparse_sync", "--env PSKV_SERVER_WEIGHTS=1,3"), 0);
}
TEST(DistKVStorePlacement, AWeightCountOtherThanTheServersIsAnError) {
  EXPECT_NE(Launch(2, 2, "sync", "--env PSKV_SERVER_WEIGHTS=1,2,3", 1), 0);
}
