// Answers sent with a KVServer: one exit for a key range's replies.
#include "kvstore/distributed/server/answers.h"

#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"

namespace pskv {

uint64_t RangeOf::PsKey(int64_t wire_key) const {
  return dist::PsKey(wire_key, index(), node->num_servers());
}

void ServerAnswers::Values(const KVRequest& req, KeyValues keys) {
  // [observe] the reply step (timeline, counters; bytes sent to the worker)
  uint64_t obs_bytes = 0;
  if (obs::Enabled() && req.pull)
    for (auto& k : keys) obs_bytes += k.second.value.nbytes();
  // (per-peer bytes are counted by the KV layer, for every request)
  obs::StepScope obs_step("reply", keys.size() == 1 ? dist::KeyOf(keys[0].first) : -1, obs_bytes);
  if (!req.pull || keys.empty()) {
    server_->Respond(req);
    return;
  }
  std::vector<uint64_t> ks(keys.size()), lens(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ks[i] = range_.PsKey(keys[i].first);
    lens[i] = keys[i].second.value.nbytes();
  }
  Frame f;
  if (keys.size() == 1) {  // the reply points at the value
    auto owner = std::make_shared<ReplyOwner>(std::move(keys[0].second));
    f.data = static_cast<const char*>(owner->value.raw());
    f.size = owner->value.nbytes();
    f.owner = std::move(owner);
  } else {  // several keys: the pieces of one frame point at their values
    std::vector<Frame::Piece> pieces(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      pieces[i] = {static_cast<const char*>(keys[i].second.value.raw()), lens[i]};
    f = Frame::Gather(std::move(pieces), std::make_shared<KeyValues>(std::move(keys)));
  }
  server_->Respond(req, ks, std::move(f), lens);
}

void ServerAnswers::Blob(const KVRequest& req, uint64_t ps_key,
                         std::shared_ptr<const std::string> blob) {
  Frame f;
  f.data = blob->data();
  f.size = blob->size();
  f.owner = blob;
  server_->Respond(req, {ps_key}, std::move(f), {blob->size()});
}

}  // namespace pskv
