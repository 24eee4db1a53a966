// Writes the seed corpus (valid messages of every kind, in the fuzz input format).
#include <cstdio>
#include <string>
#include <vector>

#include "protocol/message.h"

using namespace pskv;

static void Write(const std::string& dir, const std::string& name, const Message& m) {
  std::string out;
  for (auto& f : Encode(m)) {
    uint16_t len = static_cast<uint16_t>(f.size);
    out.append(reinterpret_cast<const char*>(&len), 2);
    out.append(f.data, f.size);
  }
  FILE* fp = std::fopen((dir + "/" + name).c_str(), "wb");
  std::fwrite(out.data(), 1, out.size(), fp);
  std::fclose(fp);
}

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  Message data;
  data.h.flags = kRequest | kPush | kPull;
  data.h.num_keys = 2;
  data.h.vals_len = 8;
  std::vector<uint64_t> keys = {1, 5}, lens = {4, 4};
  data.keys = Frame::Copy(keys.data(), 16);
  data.lens = Frame::Copy(lens.data(), 16);
  data.vals = Frame::FromString("abcdefgh");
  Write(dir, "data", data);
  Message cmd;
  cmd.h.flags = kRequest | kCommand;
  cmd.h.head = 2;
  cmd.body = "type=sgd\nlearning_rate=0.1\n";
  Write(dir, "command", cmd);
  Message reg;
  reg.h.control = static_cast<uint8_t>(Control::kRegister);
  NodeDesc d;
  d.host = "127.0.0.1";
  d.port = 9000;
  reg.body = EncodeNodes({d});
  Write(dir, "register", reg);
  Message ack;
  ack.h.control = static_cast<uint8_t>(Control::kAck);
  ack.h.timestamp = 7;
  Write(dir, "ack", ack);
  Message err;
  err.h.flags = kError;
  err.body = "key 3 has not been inited";
  Write(dir, "error", err);
  return 0;
}
