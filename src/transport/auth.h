// Job credentials, derived from the job secret with libsodium (no home-made
// crypto). See docs/security.md for the threat model.
//
// Every connection between two nodes is authenticated by ZeroMQ's handshake
// before a single message is delivered:
//  * authenticated mode (default with a secret): ZeroMQ's PLAIN mechanism carries
//    username "pskv2 <job> <from> <to>" and password HMAC-SHA256(key, username);
//    the accepting node's ZAP handler verifies it in constant time, checks that
//    the credential is addressed to itself (`to` is its own random token, or 0 =
//    "the scheduler" at the scheduler), and binds the connection to `from` (the
//    connecting process's random 64-bit identity). A credential therefore opens
//    one door only: the one it was issued for. Whoever receives it (a process
//    squatting on an address a node connects to, say) cannot use it elsewhere;
//    tokens are fresh per process, so it is worthless after that process exits;
//  * encrypted mode (PSKV_ENCRYPT=1): ZeroMQ CURVE with keys derived from the
//    secret — every byte is encrypted and authenticated;
//  * open mode (no secret): the same handshake with a key derived from the empty
//    secret, which anyone can compute: it tells pskv jobs apart and binds
//    identities, but keeps no stranger out (MXNet's behaviour).
// After the handshake, a message's sender is the token bound to its connection,
// never a header field.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace pskv {

using Key32 = std::array<uint8_t, 32>;

class JobKeys {
 public:
  /// Derives every key from `secret` (empty: open mode) for job hash `job`.
  JobKeys(const std::string& secret, uint64_t job);

  bool open() const { return open_; }
  uint64_t job() const { return job_; }

  /// The `to` of a credential addressed to the job's scheduler, whose token is
  /// not known before registration.
  static constexpr uint64_t kScheduler = 0;

  /// PLAIN credentials of the process with identity `from` for connecting to the
  /// process with identity `to` (kScheduler: the scheduler).
  std::string Username(uint64_t from, uint64_t to) const;
  std::string Password(const std::string& username) const;
  /// Checks PLAIN credentials presented to the process with identity `me`
  /// (`scheduler`: it is the job's scheduler). On success returns true and sets
  /// *from; else returns false and sets *why (short, for logs and the ZAP status).
  bool Verify(const std::string& username, const std::string& password, uint64_t me, bool scheduler,
              uint64_t* from, std::string* why) const;

  /// CURVE keys (Z85 text as ZeroMQ's options take them).
  const std::string& curve_server_public() const { return server_pk_; }
  const std::string& curve_server_secret() const { return server_sk_; }
  const std::string& curve_client_public() const { return client_pk_; }
  const std::string& curve_client_secret() const { return client_sk_; }

 private:
  Key32 Subkey(const char* label) const;
  bool open_;
  uint64_t job_;
  Key32 master_{};
  Key32 mac_key_{};
  std::string server_pk_, server_sk_, client_pk_, client_sk_;
};

/// A new random secret (64 hex characters) from the OS's CSPRNG.
std::string NewJobSecret();

}  // namespace pskv
