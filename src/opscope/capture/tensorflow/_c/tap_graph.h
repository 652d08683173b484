// The graph helpers of the tap passes (tap_passes.cc): which nodes are the dump's, how a
// tensor is named past the ops that only pass it on, and what a node was before Grappler
// (the Snapshot that tap_same.h compares with what Grappler left).
#ifndef OPSCOPE_TAP_GRAPH_H
#define OPSCOPE_TAP_GRAPH_H

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/graph/graph.h"

namespace opscope_tap {

using tensorflow::DataType;
using tensorflow::Edge;
using tensorflow::Node;

inline bool OneOf(const std::string& op, std::initializer_list<const char*> ops) {
    for (const char* o : ops)
        if (op == o) return true;
    return false;
}

inline std::string Key(const std::string& node, int slot) { return node + ":" + std::to_string(slot); }
inline std::string Key(const Node* n, int slot) { return Key(n->name(), slot); }

// "node:slot" as (node, slot); anything else as (itself, 0). Never throws: it runs inside
// TensorFlow's function instantiation.
inline std::pair<std::string, int> Split(const std::string& key) {
    const size_t colon = key.rfind(':');
    if (colon == std::string::npos || colon + 1 == key.size()) return {key, 0};
    int slot = 0;
    for (size_t i = colon + 1; i < key.size(); i++) {
        if (key[i] < '0' || key[i] > '9' || slot > 1000000) return {key, 0};
        slot = slot * 10 + (key[i] - '0');
    }
    return {key.substr(0, colon), slot};
}

// A node the dump added: its ops live in an "opscope_dump" name scope.
inline bool Ours(const Node* n) {
    const std::string& name = n->name();
    for (size_t at = 0; at < name.size();) {
        if (name.compare(at, 12, "opscope_dump") == 0) return true;
        const size_t slash = name.find('/', at);
        if (slash == std::string::npos) break;
        at = slash + 1;
    }
    return false;
}

// An op of the dump that reads the graph's tensors.
inline bool IsTap(const Node* n) {
    return n->type_string() == "OpscopeStats" || (Ours(n) && OneOf(n->type_string(), {"PyFunc", "EagerPyFunc"}));
}

inline std::vector<const Edge*> DataInputs(const Node* n) {
    std::vector<const Edge*> edges(n->num_inputs(), nullptr);
    for (const Edge* e : n->in_edges())
        if (!e->IsControlEdge()) edges[e->dst_input()] = e;
    return edges;
}

// Ops whose output is their input, same shape (IdentityN: output k is input k).
inline bool PassesOn(const Node* n) {
    return OneOf(n->type_string(), {"Identity", "IdentityN", "StopGradient", "PreventGradient", "Snapshot",
                                    "EnsureShape"});
}

// Ops whose output holds their input's elements, in order (the dump's views: plan.ALIASES).
inline bool IsView(const Node* n) {
    return PassesOn(n) || OneOf(n->type_string(), {"Reshape", "ExpandDims", "Squeeze"});
}

// The input edge a view's output `slot` passes on.
inline const Edge* ViewSource(const Node* n, int slot) {
    const int index = n->type_string() == "IdentityN" ? slot : 0;
    const Edge* e = nullptr;
    if (index >= n->num_inputs() || !n->input_edge(index, &e).ok()) return nullptr;
    return e;
}

// The tensor an edge carries, named past identities (or, with `views`, past every view):
// Grappler removes most of them, and the inlined functions' argument identities with them.
inline std::pair<const Node*, int> Resolve(const Edge* e, bool views) {
    const Node* src = e->src();
    int slot = e->src_output();
    while (views ? IsView(src) : PassesOn(src)) {
        const Edge* up = ViewSource(src, slot);
        if (up == nullptr || up->IsControlEdge()) break;
        src = up->src();
        slot = up->src_output();
    }
    return {src, slot};
}

// An input as SameCheck compares it: "<const>" from a constant, "<int>" an integer input
// (shapes and axes, which Grappler folds into constants), else the tensor, past views.
inline std::string Token(const Edge* e, const Node* dst) {
    const auto [src, slot] = Resolve(e, true);
    if (src->type_string() == "Const") return "<const>";
    const DataType t = dst->input_type(e->dst_input());
    if (t == tensorflow::DT_INT32 || t == tensorflow::DT_INT64) return "<int>";
    return Key(src, slot);
}

// Ops whose inputs Grappler may put in another order without changing what they compute.
inline bool Commutative(const std::string& op) {
    return OneOf(op, {"Add", "AddV2", "AddN", "Mul", "Maximum", "Minimum", "SquaredDifference", "Equal",
                      "NotEqual", "LogicalAnd", "LogicalOr"});
}

// Grappler's in-place rewrites of a node into another op over the same inputs, the same
// quantity (division by a constant as a product with its reciprocal; Pow by a constant).
inline bool Equivalent(const std::string& was, const std::string& now) {
    if (OneOf(was, {"RealDiv", "Div"})) return now == "Mul";
    return was == "Pow" && OneOf(now, {"Square", "Sqrt", "Rsqrt", "Reciprocal"});
}

// A node as it was before Grappler.
struct Before {
    std::string op;
    bool pure = false;  // its outputs depend on its data inputs only: not stateful, reads no resource
    std::vector<std::string> inputs;  // Token of each data input, in order
};
using Snapshot = std::unordered_map<std::string, Before>;

inline Snapshot TakeSnapshot(const tensorflow::Graph* g) {
    Snapshot before;
    for (const Node* n : g->op_nodes()) {
        Before& b = before[n->name()];
        b.op = n->type_string();
        b.pure = !n->op_def().is_stateful();
        for (const Edge* e : DataInputs(n)) {
            b.inputs.push_back(e == nullptr ? "" : Token(e, n));
            const DataType t = n->input_type(b.inputs.size() - 1);
            if (t == tensorflow::DT_RESOURCE || t == tensorflow::DT_VARIANT) b.pure = false;  // a variable's read
        }
    }
    return before;
}

}  // namespace opscope_tap

#endif  // OPSCOPE_TAP_GRAPH_H
