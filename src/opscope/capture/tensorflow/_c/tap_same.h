// SameCheck: whether Grappler left a node computing what it computed before, and which
// tensor now holds a value a tap read before (tap_passes.cc's RestoreTaps). Included by
// tap_passes.cc only.
#ifndef OPSCOPE_TAP_SAME_H
#define OPSCOPE_TAP_SAME_H

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tap_graph.h"

namespace opscope_tap {

// The family of an associative, commutative op: Grappler regroups chains of one family
// (AddOpsRewrite, MinimizeBroadcasts), so a chain's root is compared by its leaves.
inline const char* Family(const std::string& op) {
    if (OneOf(op, {"Add", "AddV2", "AddN"})) return "add";
    return op == "Mul" ? "mul" : "";
}

// Ops Grappler removes when they change nothing (a Transpose by the identity, a Sum over no
// axis): their consumers then read their one tensor input.
inline bool MayVanish(const std::string& op) {
    return OneOf(op, {"Transpose", "Sum", "Prod", "Mean", "Max", "Min", "Tile", "Slice", "StridedSlice", "Pad",
                      "ReverseV2", "Reshape", "Squeeze", "ExpandDims", "Identity", "StopGradient", "Snapshot"});
}

inline bool Special(const std::string& token) { return token == "<const>" || token == "<int>"; }

// Whether Grappler left a node computing what it computed before (memoized): the same op
// (or an Equivalent one) over the same input tensors, or, for a chain of one Family, the same
// leaves. The node itself, not its inputs' producers: a producer Grappler rewrote (a division
// by a folded constant made a product) computed what the run computed, which is what the taps
// record (requiring it left the whole backward of Keras' MobileNetV2 absent, session 13). Constants and shape arithmetic are compared by kind (Grappler folds and shares
// them). A tensor before is looked for now as Holder finds it.
class SameCheck {
  public:
    SameCheck(const Snapshot& before, const std::unordered_map<std::string, Node*>& after)
        : before_(before), after_(after) {
        for (const auto& [name, b] : before_)
            if (after_.count(name) && Twinnable(b)) twins_.emplace(Signature(b), name);
        for (const auto& [name, node] : after_) {
            bool trusted = false;
            const std::string was = Renamed(name, &trusted);
            if (was.empty()) continue;
            renamed_[was] = node;
            was_[name] = was;
            if (trusted) trusted_.insert(name);
        }
    }

    // The node that now has `name`: itself, or the one the arithmetic optimizer renamed it to.
    Node* Find(const std::string& name) const {
        auto it = after_.find(name);
        if (it != after_.end()) return it->second;
        it = renamed_.find(name);
        return it == renamed_.end() ? nullptr : it->second;
    }

    // The tensor ("node:slot") that now holds what `token` held before: itself (a constant
    // where Grappler folded it); for a node Grappler merged with its twin (same op, same
    // inputs), the twin; for one it removed as a no-op, its one tensor input. "" if none.
    std::string Holder(std::string token) {
        for (int hops = 0; hops < 64; hops++) {
            const std::string node = Split(token).first;
            if (Find(node) != nullptr) return token;
            std::string next = Twin(token);
            if (next == token) next = SoleInput(node);
            if (next.empty()) return "";
            token = next;
        }
        return "";
    }

    bool Same(const std::string& name) {
        return Memo(same_, name, true, [this](const std::string& n) { return Judge(n); });
    }

  private:
    static constexpr int kMaxLeaves = 256;

    // The arithmetic optimizer's stages that replace a node by one of another name
    // ("<scope>/ArithmeticOptimizer/<stage><name>"): a node that holds the same value (the
    // sum of a chain it merged; x + x as 2 * x; x * x as Square(x)), trusted as it is; or a
    // Cast moved past a view ("...ReorderCastLikeAndValuePreserving_<type>_<name>"), judged.
    struct Stage {
        const char* prefix;
        bool typed, trusted;
    };
    static constexpr Stage kStages[] = {{"ArithmeticOptimizer/AddOpsRewrite_", false, true},
                                        {"ArithmeticOptimizer/SimplifyAggregation_Mul_", false, true},
                                        {"ArithmeticOptimizer/ReplaceMulWithSquare_", false, true},
                                        {"ArithmeticOptimizer/ReorderCastLikeAndValuePreserving_", true, false}};

    // The name a node such a stage made replaced ("" if it is no such node); `trusted`.
    static std::string Renamed(const std::string& name, bool* trusted) {
        for (const Stage& stage : kStages) {
            const size_t at = name.find(stage.prefix);
            if (at == std::string::npos || (at > 0 && name[at - 1] != '/')) continue;
            std::string rest = name.substr(at + std::strlen(stage.prefix));
            if (stage.typed) rest = rest.substr(rest.find('_') + 1);  // past the type
            *trusted = stage.trusted;
            return name.substr(0, at) + rest;
        }
        return "";
    }

    template <typename F>
    static bool Memo(std::unordered_map<std::string, bool>& memo, const std::string& name, bool looped, F judge) {
        auto it = memo.find(name);
        if (it != memo.end()) return it->second;
        memo[name] = looped;  // what a loop (NextIteration) that comes back here finds
        const bool ok = judge(name);
        memo[name] = ok;
        return ok;
    }

    // A node's Family before; a division by a constant is a product (Grappler makes it one).
    static std::string FamilyOf(const Before& b) {
        if (OneOf(b.op, {"RealDiv", "Div"}) && b.inputs.size() == 2 && b.inputs[1] == "<const>") return "mul";
        return Family(b.op);
    }

    static std::string Signature(const Before& b) {
        std::vector<std::string> inputs = b.inputs;
        if (Commutative(b.op)) std::sort(inputs.begin(), inputs.end());
        std::string sig = b.op;
        for (const std::string& i : inputs) sig += "|" + i;
        return sig;
    }

    // Twins are told apart by their inputs: only pure nodes whose inputs are all tensors (two
    // nodes over different constants would look alike, two reads of a variable too).
    static bool Twinnable(const Before& b) {
        if (!b.pure || b.inputs.empty()) return false;
        for (const std::string& i : b.inputs)
            if (Special(i) || i.empty()) return false;
        return true;
    }

    bool Judge(const std::string& name) {
        Node* now = Find(name);
        auto was = before_.find(name);
        if (now == nullptr || was == before_.end()) return false;
        const std::string& op = now->type_string();
        if (op == "Const") return true;  // folded: the op's own kernel computed it
        if (trusted_.count(now->name())) return true;  // the same value, computed another way
        const bool fused = op.rfind("_Fused", 0) == 0 && op != was->second.op;
        if (op != was->second.op && !fused && !Equivalent(was->second.op, op)) return false;
        std::vector<std::string> inputs, before;
        const std::string family = Family(op);
        int budget = kMaxLeaves;
        if (fused) {  // the remapper's fusion, named after the pattern's last op: what the pattern read
            inputs = Inputs(now);
            FusedLeaves(was->second, &before, &budget);
        } else if (!family.empty() && family == FamilyOf(was->second)) {
            LeavesNow(now, family, &inputs, &budget);
            LeavesBefore(was->second, family, &before, &budget);
        } else {
            inputs = Inputs(now);
            before = InputsBefore(was->second);
        }
        if (budget < 0) return false;
        if (!family.empty() || Commutative(op) || op != was->second.op) {
            std::sort(inputs.begin(), inputs.end());
            std::sort(before.begin(), before.end());
        }
        return inputs == before;
    }

    // A node's tensor inputs now; a merged chain's root under the name it had.
    std::vector<std::string> Inputs(const Node* now) const {
        std::vector<std::string> out;
        for (const Edge* e : DataInputs(now)) {
            const std::string token = e == nullptr ? "<none>" : Token(e, now);
            if (!Special(token)) out.push_back(Was(token));
        }
        return out;
    }

    // A tensor now under the name it had before.
    std::string Was(const std::string& token) const {
        const auto [node, slot] = Split(token);
        auto it = was_.find(node);
        return it == was_.end() ? token : Key(it->second, slot);
    }

    // A node's tensor inputs before, each as its Holder now, less those folded since.
    std::vector<std::string> InputsBefore(const Before& was) {
        std::vector<std::string> out;
        for (const std::string& token : was.inputs)
            if (!Special(token)) Add(token, &out);
        return out;
    }

    // `token` as its Holder; nothing where a constant holds it now (compared by kind).
    void Add(const std::string& token, std::vector<std::string>* out) {
        const std::string holder = Holder(token);
        const Node* now = holder.empty() ? nullptr : Find(Split(holder).first);
        if (now != nullptr && now->type_string() != "Const") {
            out->push_back(holder);
        } else if (now == nullptr && !Folded(Split(token).first)) {
            out->push_back(token);  // gone, and not into a constant: the comparison fails
        }
    }

    // The leaves of the chain of `family` ops that ends at `now` (its inputs, through inputs
    // of the same family; a node a stage replaced is a leaf, under its old name, on both sides).
    void LeavesNow(const Node* now, const std::string& family, std::vector<std::string>* out, int* budget) const {
        for (const Edge* e : DataInputs(now)) {
            if (e == nullptr || --*budget < 0) return;
            const auto [src, slot] = Resolve(e, true);
            if (family == Family(src->type_string()) && !was_.count(src->name())) {
                LeavesNow(src, family, out, budget);
            } else {
                const std::string token = Token(e, now);
                if (!Special(token)) out->push_back(Was(token));
            }
        }
    }

    void LeavesBefore(const Before& was, const std::string& family, std::vector<std::string>* out, int* budget) {
        for (const std::string& token : was.inputs) {
            if (Special(token) || --*budget < 0) continue;
            auto up = before_.find(Split(token).first);
            if (up != before_.end() && family == FamilyOf(up->second) && !renamed_.count(up->first)) {
                LeavesBefore(up->second, family, out, budget);
                continue;
            }
            Add(token, out);
        }
    }

    // The tensors a fused pattern read: a node's inputs, through the nodes fused away with it
    // (gone since, and used by nothing else that is still there: the remapper's condition).
    void FusedLeaves(const Before& was, std::vector<std::string>* out, int* budget) {
        for (const std::string& token : was.inputs) {
            if (Special(token) || --*budget < 0) continue;
            const std::string node = Split(token).first;
            auto up = before_.find(node);
            if (Find(node) == nullptr && up != before_.end() && Twin(token) == token) {
                FusedLeaves(up->second, out, budget);
            } else {
                Add(token, out);
            }
        }
    }

    // Computed from constants only (Grappler's constant folding may have made it one).
    bool Folded(const std::string& name) {
        return Memo(folded_, name, false, [this](const std::string& n) {
            auto was = before_.find(n);
            if (was == before_.end() || !was->second.pure || was->second.inputs.empty()) return false;
            for (const std::string& token : was->second.inputs)
                if (!Special(token) && !Folded(Split(token).first)) return false;
            return true;
        });
    }

    // The tensor of the node Grappler merged `token`'s node with, or `token` itself.
    std::string Twin(const std::string& token) const {
        const auto [node, slot] = Split(token);
        auto was = before_.find(node);
        auto twin = was == before_.end() ? twins_.end() : twins_.find(Signature(was->second));
        return twin == twins_.end() ? token : Key(twin->second, slot);
    }

    // The one tensor input of a node that may vanish ("" when it had none or several).
    std::string SoleInput(const std::string& node) const {
        auto was = before_.find(node);
        if (was == before_.end() || !MayVanish(was->second.op)) return "";
        std::string sole;
        for (const std::string& token : was->second.inputs) {
            if (Special(token)) continue;
            if (!sole.empty()) return "";
            sole = token;
        }
        return sole;
    }

    const Snapshot& before_;
    const std::unordered_map<std::string, Node*>& after_;
    std::unordered_map<std::string, std::string> twins_;  // signature -> a node with it that is still there
    std::unordered_map<std::string, Node*> renamed_;       // name before -> the node renamed from it
    std::unordered_map<std::string, std::string> was_;     // and back
    std::unordered_set<std::string> trusted_;              // those that hold the same value
    std::unordered_map<std::string, bool> same_, folded_;
};

}  // namespace opscope_tap

#endif  // OPSCOPE_TAP_SAME_H
