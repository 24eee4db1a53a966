#include "kvstore/distributed/worker/collective_init.h"

#include "kvstore/dist_protocol.h"

namespace pskv::dist {

void CollectiveInit(ServerLink& link, const payload::InitReport& report,
                    const std::function<void(size_t)>& push_rank0) {
  // Server 0, or every live server ({}) when servers replicate.
  const std::vector<int> to =
      link.node()->replicated() ? std::vector<int>{} : std::vector<int>{ServerId(0)};
  link.Command(kReportInit, payload::EncodeInitReport(report), to);
  std::exception_ptr err;
  if (link.rank() == 0) {
    // Rank 0's values initialise the servers; the others' are only checked.
    payload::InitReport failures;
    for (size_t i = 0; i < report.entries.size(); ++i) {
      try {
        push_rank0(i);
      } catch (const std::exception& e) {
        if (!err) err = std::current_exception();
        failures.failures.push_back({report.entries[i].id, e.what()});
      }
    }
    if (!failures.failures.empty() && !link.broken())
      link.Command(kReportInit, payload::EncodeInitReport(failures), to);
  }
  if (link.broken() && err) std::rethrow_exception(err);
  link.WorkerBarrier();
  std::vector<int64_t> ids;
  ids.reserve(report.entries.size());
  for (auto& e : report.entries) ids.push_back(e.id);
  link.Command(kCheckInit, payload::EncodeCheckInit(ids), to);
  if (err) std::rethrow_exception(err);
}

}  // namespace pskv::dist
