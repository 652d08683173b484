// The dump's taps kept out of Grappler's sight, so that a dumped graph computes what the
// bare graph computes, bit for bit (docs/tensorflow.md, "How it works" and session 12).
//
// The dump reads a traced graph's tensors through its own ops (OpscopeStats, and the host
// callback's PyFunc), added when the function is traced. Each data edge into them is one more
// consumer of a tensor, and Grappler rewrites a chain only where its inner tensors have one
// consumer (the arithmetic optimizer regroups Add and Mul chains, the remapper fuses ops):
// with the taps in sight, the dumped graph was rewritten less and rounded differently. So:
//   HideTaps (after placement, before Grappler; functions are inlined by then) points every
//   tap input at an empty placeholder constant and writes down which tensor it was (a
//   variable read's stays: no rewrite depends on a read's consumers);
//   RestoreTaps (after Grappler) points it back at the tensor that now holds that value
//   (tap_same.h: the same node computing the same, or what Grappler turned it into). A tensor
//   Grappler pruned, merged away or now computes as another quantity has none: its tap keeps
//   the placeholder, whose rank-8, zero-element shape tells the host it is absent
//   (absent.MISSING_SHAPE).
// AddN sums its inputs in another order when it may write into one of them other than the
// first (it takes the first input buffer no one else holds). A tap still holding an input
// changes that choice, and, with taps running when their values are ready, changes it from
// run to run. So a tap's value that feeds (through views) an AddN of three or more inputs is
// read from a copy that is made before that AddN runs.
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tap_same.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/graph/control_flow.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

namespace {

using namespace opscope_tap;  // NOLINT: this file's own helpers
using tensorflow::Graph;
using tensorflow::GraphOptimizationPass;
using tensorflow::GraphOptimizationPassOptions;
using Registry = tensorflow::OptimizationPassRegistry;

constexpr char kSources[] = "_opscope_sources";  // per tap input: "node:slot", "" where not hidden
constexpr char kSnapshot[] = "_opscope_snapshot";
constexpr int kMissingRank = 8;  // the placeholder: shape [0] * 8 (absent.MISSING_SHAPE)

std::mutex snapshots_mu;
std::map<int64_t, Snapshot> snapshots;  // taken by HideTaps, used once by RestoreTaps
int64_t next_snapshot = 0;

// The placeholders hidden tap inputs read: an empty constant per dtype and device, entered
// (as a loop invariant) into the frame of a tap inside a lowered while loop, frame by frame
// for a loop inside a loop (fit's steps_per_execution > 1 around a model's own loop): a node's
// inputs must come from its own frame.
class Holes {
  public:
    Holes(Graph* g, std::vector<tensorflow::ControlFlowInfo> flow) : g_(g), flow_(std::move(flow)) {}

    // nullptr for a tap out of the flow's reach (its inputs then stay in Grappler's sight).
    Node* For(const Node* tap, DataType dtype) {
        if (tap->id() >= static_cast<int>(flow_.size()) || flow_[tap->id()].frame == nullptr) return nullptr;
        return In(flow_[tap->id()].frame, dtype, tap->assigned_device_name(), 0);
    }

  private:
    // The placeholder in the frame `frame` enters (one of its Enter nodes; the source node:
    // outside every loop), made of the one in its parent frame.
    Node* In(const Node* frame, DataType dtype, const std::string& device, int depth) {
        const bool source = frame->IsSource();
        if (!source && (depth > 32 || frame->id() >= static_cast<int>(flow_.size()))) return nullptr;
        const tensorflow::ControlFlowInfo* where = source ? nullptr : &flow_[frame->id()];
        const std::string name = source ? "" : where->frame_name;
        const auto key = std::make_pair(dtype, device + "|" + name);
        auto found = made_.find(key);
        if (found != made_.end()) return found->second;
        Node* node = nullptr;
        if (source) {
            node = Constant(dtype, device);
        } else if (where->parent_frame != nullptr) {
            Node* outer = In(where->parent_frame, dtype, device, depth + 1);
            if (outer != nullptr) node = Enter(outer, frame, name, device);
        }
        made_[key] = node;
        return node;
    }

    Node* Constant(DataType dtype, const std::string& device) {
        tensorflow::Tensor empty(dtype, tensorflow::TensorShape(std::vector<int64_t>(kMissingRank, 0)));
        Node* value = nullptr;
        if (!tensorflow::NodeBuilder(g_->NewName("opscope_dump/missing"), "Const")
                 .Attr("dtype", dtype)
                 .Attr("value", empty)
                 .Finalize(g_, &value)
                 .ok())
            return nullptr;
        value->set_assigned_device_name(device);
        return value;
    }

    Node* Enter(Node* outer, const Node* frame, const std::string& name, const std::string& device) {
        int64_t parallel = 10;
        tensorflow::TryGetNodeAttr(frame->attrs(), "parallel_iterations", &parallel);
        Node* entered = nullptr;
        if (!tensorflow::NodeBuilder(g_->NewName("opscope_dump/missing_in_loop"), "Enter")
                 .Input(outer)
                 .Attr("frame_name", name)
                 .Attr("is_constant", true)
                 .Attr("parallel_iterations", parallel)
                 .Finalize(g_, &entered)
                 .ok())
            return nullptr;
        entered->set_assigned_device_name(device);
        return entered;
    }

    Graph* g_;
    std::vector<tensorflow::ControlFlowInfo> flow_;
    std::map<std::pair<DataType, std::string>, Node*> made_;
};

// One tap's inputs pointed at placeholders; returns where each came from.
std::vector<std::string> Hide(Graph* g, Node* tap, Holes* holes) {
    std::vector<std::string> sources(tap->num_inputs());
    for (const Edge* e : DataInputs(tap)) {
        if (e == nullptr || Ours(e->src())) continue;
        const int index = e->dst_input();
        const auto [src, slot] = Resolve(e, false);  // past identities, which Grappler removes
        if (src->type_string() == "ReadVariableOp") continue;  // no rewrite hangs on a read's consumers
        Node* hole = holes->For(tap, tap->input_type(index));
        if (hole != nullptr && g->UpdateEdge(hole, 0, tap, index).ok()) sources[index] = Key(src, slot);
    }
    return sources;
}

class HideTaps : public GraphOptimizationPass {
  public:
    tensorflow::Status Run(const GraphOptimizationPassOptions& options) override {
        Graph* g = options.graph == nullptr ? nullptr : options.graph->get();
        if (g == nullptr) return tensorflow::OkStatus();
        std::vector<Node*> taps;
        int64_t hidden;
        for (Node* n : g->op_nodes())  // (a second load of the library registers a second pass)
            if (IsTap(n) && !tensorflow::TryGetNodeAttr(n->attrs(), kSnapshot, &hidden)) taps.push_back(n);
        std::vector<tensorflow::ControlFlowInfo> flow;
        if (taps.empty() || !tensorflow::BuildControlFlowInfo(g, &flow).ok()) return tensorflow::OkStatus();
        Snapshot before = TakeSnapshot(g);
        int64_t key;
        {
            std::lock_guard<std::mutex> lock(snapshots_mu);
            key = next_snapshot++;
            snapshots[key] = std::move(before);
        }
        Holes holes(g, std::move(flow));
        for (Node* tap : taps) {
            tap->AddAttr(kSources, Hide(g, tap, &holes));
            tap->AddAttr(kSnapshot, key);
        }
        return tensorflow::OkStatus();
    }
};

// One tap's inputs pointed back at the tensors that hold their values now, where Grappler
// left those computing what they computed.
void Restore(Graph* g, Node* tap, SameCheck* same) {
    std::vector<std::string> sources;
    if (!tensorflow::TryGetNodeAttr(tap->attrs(), kSources, &sources)) return;
    for (size_t i = 0; i < sources.size() && i < static_cast<size_t>(tap->num_inputs()); i++) {
        const std::string holder = sources[i].empty() ? "" : same->Holder(sources[i]);
        if (holder.empty()) continue;  // stays on the placeholder: absent
        const auto [name, slot] = Split(holder);
        Node* src = same->Find(name);
        if (slot < src->num_outputs() && src->output_type(slot) == tap->input_type(i) && same->Same(name))
            g->UpdateEdge(src, slot, tap, static_cast<int>(i)).IgnoreError();
    }
}

// The tensors that share an AddN input's buffer: up through views to the tensor that owns
// it, then down through every view of that one.
std::vector<std::pair<Node*, int>> Sharing(const Edge* input) {
    Node* root = input->src();
    int slot = input->src_output();
    for (const Edge* up; IsView(root) && (up = ViewSource(root, slot)) != nullptr && !up->IsControlEdge();) {
        root = up->src();
        slot = up->src_output();
    }
    std::vector<std::pair<Node*, int>> out = {{root, slot}};
    for (size_t k = 0; k < out.size() && out.size() < 256; k++) {
        for (const Edge* e : out[k].first->out_edges()) {
            if (e->IsControlEdge() || e->src_output() != out[k].second || !IsView(e->dst())) continue;
            const int from = e->dst()->type_string() == "IdentityN" ? e->dst_input() : 0;
            if (e->dst_input() == from) out.emplace_back(e->dst(), from);
        }
    }
    return out;
}

Node* CopyOf(Graph* g, Node* src, int slot) {
    Node* copy = nullptr;
    if (!tensorflow::NodeBuilder(g->NewName("opscope_dump/copy"), "Snapshot").Input(src, slot).Finalize(g, &copy).ok())
        return nullptr;
    copy->set_assigned_device_name(src->assigned_device_name());
    return copy;
}

// Taps that read (through views) an input of an AddN of three or more inputs read a copy,
// made before the AddN runs: the AddN then finds its inputs held as in the bare graph.
void CopyBeforeSums(Graph* g) {
    std::vector<Node*> sums;
    for (Node* n : g->op_nodes())
        if (n->type_string() == "AddN" && n->num_inputs() >= 3) sums.push_back(n);
    std::map<std::pair<Node*, int>, Node*> copies;
    for (Node* sum : sums) {
        for (const Edge* input : DataInputs(sum)) {
            if (input == nullptr) continue;
            for (const auto& [src, slot] : Sharing(input)) {
                Node*& copy = copies[{src, slot}];
                if (copy == nullptr) {
                    std::vector<const Edge*> tapped;
                    for (const Edge* out : src->out_edges())
                        if (!out->IsControlEdge() && out->src_output() == slot && IsTap(out->dst())) tapped.push_back(out);
                    if (tapped.empty() || (copy = CopyOf(g, src, slot)) == nullptr) continue;
                    for (const Edge* out : tapped) g->UpdateEdge(copy, 0, out->dst(), out->dst_input()).IgnoreError();
                }
                g->AddControlEdge(copy, sum);
            }
        }
    }
}

// The placeholders no tap reads any more (an Enter's, then the outer frame's, then the constant).
void DropUnread(Graph* g) {
    for (bool dropped = true; dropped;) {
        std::vector<Node*> unread;
        for (Node* n : g->op_nodes())
            if (n->out_edges().empty() && n->name().find("opscope_dump/missing") != std::string::npos)
                unread.push_back(n);
        for (Node* n : unread) g->RemoveNode(n);
        dropped = !unread.empty();
    }
}

class RestoreTaps : public GraphOptimizationPass {
  public:
    tensorflow::Status Run(const GraphOptimizationPassOptions& options) override {
        Graph* g = options.graph == nullptr ? nullptr : options.graph->get();
        if (g == nullptr) return tensorflow::OkStatus();
        std::map<int64_t, std::vector<Node*>> taps;
        for (Node* n : g->op_nodes()) {
            int64_t key;
            if (IsTap(n) && tensorflow::TryGetNodeAttr(n->attrs(), kSnapshot, &key)) taps[key].push_back(n);
        }
        if (taps.empty()) return tensorflow::OkStatus();
        std::unordered_map<std::string, Node*> by_name;
        for (Node* n : g->op_nodes()) by_name[n->name()] = n;
        for (auto& [key, nodes] : taps) {
            Snapshot before;
            {
                std::lock_guard<std::mutex> lock(snapshots_mu);
                auto it = snapshots.find(key);
                if (it == snapshots.end()) continue;  // restored already: leave them
                before = std::move(it->second);
                snapshots.erase(it);
            }
            SameCheck same(before, by_name);
            for (Node* tap : nodes) Restore(g, tap, &same);
        }
        CopyBeforeSums(g);
        DropUnread(g);
        return tensorflow::OkStatus();
    }
};

}  // namespace

// After every other pass that runs once functions are inlined and placed; before any that runs
// once Grappler is done (the XLA ones included).
REGISTER_OPTIMIZATION(Registry::POST_PLACEMENT, 1000, HideTaps);
REGISTER_OPTIMIZATION(Registry::POST_REWRITE_FOR_EXEC, -1000, RestoreTaps);
