// The dist stores' dynamic embedding tables, worker side (include/pskv/embedding.h).
//
// A table is one key of the store's namespace with a part on every server: an id's
// rows live on server EmbeddingShardOf(id, servers), the key travelling as
// PsKey(WireKey(store, key), server). Create runs the collective init
// (collective_init.h: the workers' reports carry the table's width and a CRC32C of
// its configuration, so a mismatch fails every worker); rank 0 sends each server the
// configuration (kEmbeddingCreate). A push de-duplicates the batch's ids (summing
// their gradients in order of appearance) and sends every server its part, also an
// empty one (its part of a sync round); a pull asks only the servers holding some of
// the batch's distinct ids and scatters the rows back to the batch's order. With a
// cache (EmbeddingCacheConfig) a pull asks only for the ids embedding::RowCache plans,
// its clock the pushes this worker completed (in dist_sync, the rounds the servers
// applied). Save, Restore and Export are collective: rank 0 sends kEmbeddingAdmin
// between two barriers, the others then ask the servers for its outcome. The values'
// layout: distributed/wire/embedding_codec.h, embedding_admin_codec.h.
//
// Blocking: every call waits through KVWorker::Await with its timeout (the store's
// op_timeout unless given); a timeout or a dead server breaks the store (ServerLink).
// The calls do not go through the store's engine: they are synchronous.
#pragma once

#include <memory>

#include "pskv/embedding.h"

namespace pskv::dist {

class DistWorkerStore;

/// Creates table `key` of `store` (collective; see above). The configuration was
/// checked. With replicated servers (PSKV_REPLICAS=1) the servers replicate it.
std::unique_ptr<EmbeddingTable> CreateDistEmbedding(DistWorkerStore& store, int key,
                                                    const EmbeddingConfig& config,
                                                    const EmbeddingCacheConfig& cache);

}  // namespace pskv::dist
