#pragma once
namespace pskv::bench {
int BenchSyncRound(int argc, char** argv);
}
