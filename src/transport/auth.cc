#include "transport/auth.h"

#include <sodium.h>
#include <zmq.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "pskv/error.h"

namespace pskv {

namespace {

void InitSodium() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw IOError("libsodium could not be initialised");
}

std::string Hex(const uint8_t* p, size_t n) {
  std::string s(2 * n + 1, '\0');
  sodium_bin2hex(s.data(), s.size(), p, n);
  s.pop_back();
  return s;
}

std::string Z85(const Key32& k) {
  char buf[41];
  if (!zmq_z85_encode(buf, k.data(), k.size())) throw IOError("Z85 encoding failed");
  return std::string(buf, 40);
}

}  // namespace

JobKeys::JobKeys(const std::string& secret, uint64_t job) : open_(secret.empty()), job_(job) {
  InitSodium();
  crypto_generichash(master_.data(), master_.size(),
                     reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), nullptr,
                     0);
  mac_key_ = Subkey("pskv plain credential v1");
  Key32 pk, sk, seed = Subkey("pskv curve server v1");
  crypto_box_seed_keypair(pk.data(), sk.data(), seed.data());
  server_pk_ = Z85(pk);
  server_sk_ = Z85(sk);
  seed = Subkey("pskv curve client v1");
  crypto_box_seed_keypair(pk.data(), sk.data(), seed.data());
  client_pk_ = Z85(pk);
  client_sk_ = Z85(sk);
  sodium_memzero(seed.data(), seed.size());
  sodium_memzero(sk.data(), sk.size());
}

Key32 JobKeys::Subkey(const char* label) const {
  Key32 k;
  crypto_generichash(k.data(), k.size(), reinterpret_cast<const unsigned char*>(label),
                     std::strlen(label), master_.data(), master_.size());
  return k;
}

namespace {
constexpr size_t kUsernameSize = 56;  // "pskv2 " + 3 x 16 hex digits + 2 spaces

std::string Format(uint64_t job, uint64_t from, uint64_t to) {
  char b[80];
  std::snprintf(b, sizeof b, "pskv2 %016" PRIx64 " %016" PRIx64 " %016" PRIx64, job, from, to);
  return b;
}
}  // namespace

std::string JobKeys::Username(uint64_t from, uint64_t to) const {
  return Format(job_, from, to);
}

std::string JobKeys::Password(const std::string& username) const {
  uint8_t mac[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256(mac, reinterpret_cast<const unsigned char*>(username.data()),
                         username.size(), mac_key_.data());
  return Hex(mac, sizeof mac);
}

bool JobKeys::Verify(const std::string& username, const std::string& password, uint64_t me,
                     bool scheduler, uint64_t* from, std::string* why) const {
  uint64_t job = 0, tok = 0, to = 0;
  char tail = 0;
  if (username.size() != kUsernameSize ||
      std::sscanf(username.c_str(), "pskv2 %16" SCNx64 " %16" SCNx64 " %16" SCNx64 "%c", &job, &tok,
                  &to, &tail) != 3 ||
      username != Format(job, tok, to) || tok == 0) {
    *why = username.rfind("pskv1 ", 0) == 0
               ? "a node of an older pskv version (protocol 1): run the same pskv everywhere"
               : "not a pskv node (malformed credentials)";
    return false;
  }
  uint8_t mac[crypto_auth_hmacsha256_BYTES];
  size_t len = 0;
  if (password.size() != 2 * sizeof mac ||
      sodium_hex2bin(mac, sizeof mac, password.data(), password.size(), nullptr, &len, nullptr) !=
          0 ||
      len != sizeof mac ||
      crypto_auth_hmacsha256_verify(mac, reinterpret_cast<const unsigned char*>(username.data()),
                                    username.size(), mac_key_.data()) != 0) {
    *why = job != job_ ? "a node of another job (PSKV_JOB_ID, DMLC_PS_ROOT_URI:PORT, DMLC_NUM_* "
                         "or PSKV_JOB_SECRET differ)"
                       : "wrong job secret (PSKV_JOB_SECRET / PSKV_JOB_SECRET_FILE differ)";
    return false;
  }
  if (job != job_) {
    *why = "a node of another job (PSKV_JOB_ID, DMLC_PS_ROOT_URI:PORT or DMLC_NUM_* differ)";
    return false;
  }
  // Valid, but is it for this door? A credential issued for another process (or
  // for a previous incarnation of this address) is a replay or a relay.
  if (!(to == me || (scheduler && to == kScheduler))) {
    *why = "credentials issued for another node (replayed or relayed)";
    return false;
  }
  *from = tok;
  return true;
}

std::string NewJobSecret() {
  InitSodium();
  uint8_t b[32];
  randombytes_buf(b, sizeof b);
  return Hex(b, sizeof b);
}

}  // namespace pskv
