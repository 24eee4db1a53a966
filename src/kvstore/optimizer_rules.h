// The registry of update rules (pskv/update_rule.h) and its built-in rules.
#pragma once

#include <string>
#include <vector>

#include "pskv/update_rule.h"

namespace pskv {

/// Every registered type, the built-in ones first, in the order registered.
std::vector<std::string> UpdateRuleTypes();

}  // namespace pskv
