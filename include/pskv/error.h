// Typed exceptions thrown by pskv.
//
// Error policy (see docs/errors.md): everything a caller can cause or a peer can
// cause — misuse of the API, a bad configuration value, a malformed message, a dead
// node, a timeout — is reported as a subclass of pskv::Error whose message says what
// was wrong and what to do about it. pskv never aborts the process because of input
// it received. Internal invariant violations (bugs in pskv itself) are also reported
// as pskv::Error (InternalError) rather than assertions, so a long training job is
// not killed without a message.
#pragma once

#include <stdexcept>
#include <string>

namespace pskv {

/// Base class of every exception pskv throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A parameter passed by the caller is invalid (unknown type string, bad
/// compression threshold, bad optimizer hyper-parameter, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A key was used wrongly: not initialised, initialised twice, int and string keys
/// mixed, string keys initialised in a different order on different workers.
class KeyError : public Error {
 public:
  using Error::Error;
};

/// The shape, size or dtype of a value does not match the key's stored value.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// An operation is not allowed in the store's current state or type (gradient
/// compression on `local`, compression after init, async without optimizer, ...).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An environment variable or option is missing or malformed. The message names
/// the variable.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A blocking call did not complete within its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// A message received from the network was malformed, truncated, oversized, of an
/// incompatible protocol version, or from a node of another job.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// A peer node died or became unreachable; the message names the node
/// (e.g. "worker[1] at 127.0.0.1:4321").
class NodeFailure : public Error {
 public:
  using Error::Error;
};

/// An I/O or transport failure (bind, connect, file read/write).
class IOError : public Error {
 public:
  using Error::Error;
};

/// An invariant inside pskv did not hold; please report it.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace pskv
