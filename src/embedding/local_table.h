// The dynamic embedding table of a local store (include/pskv/embedding.h): one
// in-process shard (table.h), each push applied at once at the table's next step.
#pragma once

#include <memory>

#include "pskv/embedding.h"

namespace pskv::embedding {

/// Table `key` in this process (the configuration is checked: InvalidArgument).
std::unique_ptr<EmbeddingTable> CreateLocalTable(int key, const EmbeddingConfig& config);

}  // namespace pskv::embedding
