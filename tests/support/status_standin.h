// Stand-in children for launcher tests: bash scripts that send pskv status records
// (launcher/status_record.h's line format) on the status socket the launcher made,
// or as tagged output lines, so that Supervise's verdicts can be driven exactly.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher/process.h"

namespace pskv::test {

/// One status record for `who` ("role.rank"), e.g. Rec("worker.0", "phase=running").
inline std::string Rec(const std::string& who, const std::string& rest) {
  const auto dot = who.find('.');
  return "@pskv-status/1 role=" + who.substr(0, dot) + " rank=" + who.substr(dot + 1) + " " + rest;
}

/// A child named `name` running `script` in bash, where `send REC` sends one record on
/// the status socket (PSKV_STATUS=fd:N).
inline launcher::ChildSpec Script(const std::string& name, const std::string& script,
                                  launcher::StatusVia via = launcher::StatusVia::kSocket) {
  const std::string send = "send() { printf '%s' \"$1\" >&\"${PSKV_STATUS#fd:}\"; }; ";
  return {name, {"/bin/bash", "-c", send + script}, {}, false, {}, false, via, {}, {}};
}

/// Script text sending `who`'s record `rest`.
inline std::string Send(const std::string& who, const std::string& rest) {
  return "send '" + Rec(who, rest) + "'; ";
}

/// What Supervise made of a job of stand-ins: its exit status, its stderr, each child's
/// end and the wall time it took.
struct StandinOutcome {
  int status;
  std::string err;
  std::vector<launcher::ChildResult> results;
  double seconds;
};

/// Supervises `specs` quietly with a 500 ms grace and the launcher's `timeout`.
inline StandinOutcome RunStandins(const std::vector<launcher::ChildSpec>& specs,
                                  std::chrono::milliseconds timeout, bool elastic_workers = false) {
  launcher::SuperviseOptions o;
  o.timeout = timeout;
  o.elastic_workers = elastic_workers;
  o.grace = std::chrono::milliseconds(500);
  o.quiet = true;
  StandinOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStderr();
  out.status = launcher::Supervise(specs, o, &out.results);
  out.err = testing::internal::GetCapturedStderr();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace pskv::test
