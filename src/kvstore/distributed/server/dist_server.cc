// DistServer: dispatch of a key range's requests to its components (dist_server.h).
#include "kvstore/distributed/server/dist_server.h"

#include <thread>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"

namespace pskv {

using dist::Kind;

namespace {
bool IsEmbedding(Kind k) {
  return k == Kind::kEmbeddingCreate || k == Kind::kEmbeddingPush || k == Kind::kEmbeddingPull ||
         k == Kind::kEmbeddingAdmin || k == Kind::kReplicateEmbedding;
}
bool IsSparse(Kind k) {
  return k == Kind::kSparseInit || k == Kind::kSparsePush || k == Kind::kSparsePull ||
         k == Kind::kReplicateSparse;
}

// The request path: `process`, or, when a test asks for late replies
// (FailPoints::ReplyDelay, ps/fail_points.h), `process` after that long a sleep.
// Chosen once, so that no request of a production server looks at the fail point.
std::function<void(KVRequest&&)> WithReplyDelay(std::chrono::milliseconds delay,
                                                std::function<void(KVRequest&&)> process) {
  if (delay.count() <= 0) return process;
  return [delay, process = std::move(process)](KVRequest&& r) {
    std::this_thread::sleep_for(delay);
    process(std::move(r));
  };
}
}  // namespace

DistServer::DistServer(Node* node) : DistServer(node, nullptr, -1, nullptr) {}

DistServer::DistServer(Node* node, KVServer* server, int range, Replicator* replicator)
    : node_(node),
      own_server_(server ? nullptr
                         : std::make_unique<KVServer>(
                               node, [this](KVRequest&& r, KVServer*) { Handle(std::move(r)); },
                               [this](int sender, int head, const std::string& body) {
                                 return commands_.Run(sender, head, body);
                               })),
      server_(server ? server : own_server_.get()),
      range_{node, range},
      replicator_(replicator),
      answers_(server_, range_),
      store_(node, range_, &answers_, &barriers_, replicator != nullptr),
      tables_(range_, store_.config()),
      primary_(replicator ? std::make_unique<PrimaryReplication>(node, range_, replicator, &store_)
                          : nullptr),
      replica_(node, range_, replicator, &store_, &pool_),
      transfer_(node, range_, replicator, &store_, &pool_,
                [this](KVRequest&& r) { Handle(std::move(r)); }),
      process_(WithReplyDelay(node->fail_points().ReplyDelay(),
                              [this](KVRequest&& r) { Process(std::move(r)); })),
      pool_(static_cast<int>(store_.num_shards()), {},
            [this](size_t, KVRequest&& r) {
              try {
                process_(std::move(r));
              } catch (const std::exception& e) {
                PSKV_ERROR(node_->Tag() << ": request handler threw: " << e.what());
              }
            }),
      inspector_(node, &store_, &pool_, &barriers_, replicator != nullptr),
      commands_(node, server_, &store_, &tables_, &pool_, &barriers_, &inspector_, primary_.get()) {
  store_.Listen(primary_.get());
  if (replicator) {  // the tables' changes go through the same replicator (embedding_server.h)
    EmbeddingServer::Replication rep;
    rep.targets = [this](const KVRequest& r) { return primary_->Targets(r); };
    rep.send = [this](const std::vector<int>& to, Message m, Replicator::Done done) {
      replicator_->Send(to, std::move(m), std::move(done));
    };
    rep.forward = [this](const KVRequest& r, const std::vector<int>& to) {
      primary_->Forward(r, to);
    };
    rep.not_from_primary = [this](const KVRequest& r) {
      return NotFromPrimary(*node_, range_.index(), r);
    };
    rep.version = [this] { return replicator_->version(); };
    rep.replicated = [this] { node_->fail_points().RoundReplicated(range_.index()); };
    rep.replicas = node->options().replicas;
    rep.spares = node->options().spare_servers;
    tables_.SetReplication(std::move(rep));
  }
  if (node->options().elastic) {  // docs/fault-tolerance.md, "Elastic workers"
    node->AddWorkerLeftHandler([this](int id) { pool_.Exclusive([&] { store_.WorkerLeft(id); }); });
    node->AddWorkerJoinedHandler(
        [this](int id) { pool_.Exclusive([&] { store_.WorkerJoined(id); }); });
  }
  inspector_.Start();
}

DistServer::~DistServer() {
  inspector_.Stop();
  node_->fail_points().Quiesce();  // a round a test held back (HoldReplicatedRound)
  pool_.Stop();                    // requests still queued are dropped: the job is ending
}

void DistServer::Handle(KVRequest&& req) {
  // A spare's copy of the range being installed (range_install.cc).
  if (replicator_ && (transfer_.installing() || dist::CmdKind(req.cmd) == Kind::kRangeCopy) &&
      transfer_.TakenByCopy(req))
    return;
  const Message& m = req.msg;
  if (pool_.size() > 1 && dist::CmdKind(req.cmd) != Kind::kStates && m.num_keys() > 0) {
    // The shard of every key (an out-of-range key fails validation in Process).
    const KeyRange range = range_.keys();
    size_t shard = store_.ShardOf(range.DispatchKey(m.key_ptr()[0]));
    bool one = true;
    for (uint32_t i = 1; i < m.num_keys() && one; ++i)
      one = store_.ShardOf(range.DispatchKey(m.key_ptr()[i])) == shard;
    if (one) {
      const uint64_t bytes = m.h.vals_len;
      return pool_.Submit(shard, std::move(req), bytes);
    }
  }
  if (pool_.size() == 1) return pool_.Submit(0, std::move(req), 0);
  pool_.Exclusive([&] { process_(std::move(req)); });
}

void DistServer::Process(KVRequest&& req) {
  const Kind kind = dist::CmdKind(req.cmd);
  const bool sync = store_.config().sync;
  if (kind == Kind::kStates) return commands_.HandleStates(std::move(req));  // exclusive
  if (kind == Kind::kReplicate) return replica_.ApplyRound(req);  // one key: on its shard
  if (kind == Kind::kReplicateAsync) return replica_.ApplyAsync(req);
  if (IsEmbedding(kind)) {  // one key: on its shard
    if (req.push && sync && IsWorkerId(req.sender)) barriers_.Left(req.sender);
    return tables_.Handle(std::move(req), server_);
  }
  if (IsSparse(kind)) {
    if (replicator_ && !sync && kind == Kind::kSparsePush)  // only sync rounds are copied
      return answers_.Error(req,
                            {ErrorKind::kUsage, NotReplicated("row_sparse pushes in dist_async")});
    if (node_->options().elastic && sync && kind == Kind::kSparsePush)
      return answers_.Error(
          req, {ErrorKind::kUsage,
                "row_sparse pushes in dist_sync with PSKV_ELASTIC=1 are not supported (their "
                "rounds would wait for a worker that left): set PSKV_ELASTIC=0 for this job, or "
                "use dist_async (docs/fault-tolerance.md, \"Elastic workers\")"});
    return HandleSparse(std::move(req));  // one key: on its shard
  }
  if (primary_ && sync && req.push && req.pull && primary_->RetryOfWaitingPush(req)) return;
  std::vector<Item> items;
  if (auto bad = store_.Validate(req, &items)) return answers_.Error(req, *bad);
  if (kind == Kind::kInit) return store_.ApplyInit(req, items);
  if (req.push && sync) return store_.JoinRounds(std::move(req), items);
  store_.ApplyAsync(req, items);
}

// A row_sparse request: one key (this server's rows of it), handled by SparseServer.
void DistServer::HandleSparse(KVRequest&& req) {
  const Message& m = req.msg;
  int64_t key = 0;
  if (!IsValidDType(dist::CmdDType(req.cmd)) || m.num_keys() != 1 ||
      !range_.keys().WireKeyOf(m.key_ptr()[0], &key) || dist::ChunkOf(key) != 0)
    return answers_.Error(req, {ErrorKind::kInvalid, "malformed row_sparse request"});
  if (store_.FindKey(key))  // on the key's shard (a one-key request) or exclusively
    return answers_.Error(
        req, {ErrorKind::kUsage,
              "key " + std::to_string(dist::KeyOf(key)) +
                  " is dense (storage type default): a row_sparse request for it mixes storage "
                  "types, which MXNet's rule forbids"});
  const Kind kind = dist::CmdKind(req.cmd);
  if (kind == Kind::kReplicateSparse) return replica_.ApplySparse(key, std::move(req), server_);
  const RangeConfig& config = store_.config();
  SparseServer::Context ctx;
  std::vector<int> to;
  if (primary_ && (kind == Kind::kSparseInit || kind == Kind::kSparsePush))
    to = primary_->Targets(req);
  if (!to.empty()) {
    ctx.replicate = [this, to](Message copy, Replicator::Done done) {
      replicator_->Send(to, std::move(copy), std::move(done));
    };
    ctx.table_version = replicator_->version();
    ctx.answer_init = [this, to](const KVRequest& init) { primary_->Forward(init, to); };
  }
  if (kind == Kind::kSparseInit && replicator_) {
    const InitOrigin origin = InitOriginOf(req, 1, node_->num_workers());
    ctx.init_worker = origin.worker;
    ctx.init_count = origin.counts.empty() ? 0 : origin.counts[0];
  }
  ctx.sync = config.sync;
  ctx.optimizer = config.OptimizerOf(key);
  ctx.num_workers = node_->num_workers();
  ctx.done_workers = &config.done_workers;
  ctx.worker_name = [this](int id) { return node_->NodeName(id); };
  if (req.push && config.sync) barriers_.Left(req.sender);
  store_.sparse().Handle(key, std::move(req), server_, ctx);
}

}  // namespace pskv
