#pragma once
namespace pskv::bench {
int BenchSyncRound(int argc, char** argv);
int BenchStrictRounds(int argc, char** argv);
}  // namespace pskv::bench
