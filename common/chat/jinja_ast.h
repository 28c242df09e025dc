// The parsed form of a Jinja template (internal to common/chat): jinja2's lexer and parser
// (trim_blocks, lstrip_blocks, whitespace control, newline normalization) produce this tree.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat::internal {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

enum class ExprType {
  kConst,     // value
  kName,      // name
  kList,      // children
  kTuple,     // children
  kDict,      // children: key, value, key, value, ...
  kGetAttr,   // children[0].name
  kGetItem,   // children[0][children[1]]
  kSlice,     // children[0][a:b:c], slice_parts (null when absent)
  kCall,      // children[0](args)
  kFilter,    // children[0] | name(args); children[0] null in a filter block
  kTest,      // children[0] is [not] name(args)
  kNeg,       // -children[0]
  kPos,       // +children[0]
  kNot,       // not children[0]
  kAnd,       // children[0] and children[1]
  kOr,        // children[0] or children[1]
  kBinary,    // children[0] op children[1]: + - * / // % ** ~
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...
  kCondExpr,  // children[1] if children[0] else children[2] (may be null)
};

struct Expr {
  ExprType type;
  int line = 0;
  Value value;
  std::string name;              // kName, kGetAttr, kFilter, kTest; kBinary's operator
  std::vector<std::string> ops;  // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
  std::vector<ExprPtr> children;
  ExprPtr slice_parts[3];
  CallArgs args;         // kCall, kFilter, kTest
  bool negated = false;  // kTest
  bool known = true;     // kFilter, kTest: the name exists (else a runtime error)
  int height = 1;        // of the tree below, this node included
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtType {
  kData,         // text
  kPrint,        // exprs[0]
  kIf,           // exprs: conditions; bodies: one per condition, then else
  kFor,          // targets; exprs[0] iterable, exprs[1] filter (may be null); bodies[0], [1] else
  kSet,          // targets (or ns attr); exprs[0]
  kSetBlock,     // targets[0]; filters; bodies[0]
  kMacro,        // name; params, exprs = defaults (null when none); bodies[0]
  kCallBlock,    // exprs[0] the call; params (caller's); bodies[0]
  kFilterBlock,  // filters; bodies[0]
  kWith,         // targets/exprs pairs; bodies[0]
  kScope,        // bodies[0] in a scope of its own ({% generation %})
  kBreak,
  kContinue,
};

struct Target {
  std::vector<std::string> names;  // one name, or a tuple of them
  bool tuple = false;
  std::string ns_attr;  // {% set ns.attr = ... %}: names[0] is ns
};

struct Stmt {
  StmtType type;
  int line = 0;
  std::string text;  // kData; kMacro's name
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  std::vector<Target> targets;
  std::vector<ExprPtr> filters;     // kFilter exprs with null input
  std::vector<std::string> params;  // kMacro, kCallBlock
  bool has_else = false;
  // kMacro, kCallBlock: the body reads varargs, kwargs, caller (jinja2 refuses extra
  // arguments otherwise).
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};

struct Program {
  Body body;
};

absl::StatusOr<std::shared_ptr<const Program>> ParseProgram(std::string_view source,
                                                            const JinjaOptions& options);

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

}  // namespace tandem::chat::internal
