// The registry of update rules (pskv/update_rule.h) and its built-in rules.
#pragma once

#include <string>
#include <vector>

#include "device/kernel_ops.h"
#include "pskv/update_rule.h"

namespace pskv {

/// Every registered type, the built-in ones first, in the order registered.
std::vector<std::string> UpdateRuleTypes();

/// The element function of a built-in rule for `c` (device/kernel_ops.h), or kNone for
/// a registered rule (those run on the host only).
kops::UpdateKind BuiltinUpdateKind(const OptimizerConfig& c);
/// The per-update scalars of a built-in rule, computed on the host: the CPU rule and
/// the device kernels use these, so both see the same bits.
kops::UpdateScalars UpdateScalarsFor(kops::UpdateKind kind, const OptimizerConfig& c,
                                     const UpdateStep& s);

}  // namespace pskv
