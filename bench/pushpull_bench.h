#pragma once
namespace pskv::bench {
int BenchPushPull(int argc, char** argv);
int BenchSecurity(int argc, char** argv);
}  // namespace pskv::bench
