// OpscopeStats: the TensorFlow dump's statistics computed inside the graph, on the CPU.
//
// Each op takes a few of the values the dump measures (`values`, a list of tensors of the
// kernel's dtypes; opstats.py makes one op per few values, so that each runs as soon as its
// values are made) and gives back two small tensors: `stats`, float64 [10, N], the columns
// that fastats' stats_many writes into its `out` (rows 0-5 min, max, mean, std, norm, absmax;
// rows 6-9 the uint64 bits of the NaN, Inf and zero counts and the hash), and `dims`, int64,
// each value's rank followed by its dimensions. The host callback then receives those
// (concatenated) instead of ~1,100 arrays. The statistics are those of the same one-pass kernel
// (capture/torch/native/_c/fastats_kernel.h, included, not copied), so the same bits.
// An empty value's slots hold zeros (its statistics are mostly None: the host marks them).
// Stateful: never pruned, constant-folded or merged with another run's.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include "fastats_kernel.h"

#include <vector>

namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The kernel's dtype code of a TensorFlow dtype (-1: not one the kernel reads).
int code_of(DataType t) {
    switch (t) {
    case tensorflow::DT_FLOAT: return F32;
    case tensorflow::DT_DOUBLE: return F64;
    case tensorflow::DT_HALF: return F16;
    case tensorflow::DT_BFLOAT16: return BF16;
    case tensorflow::DT_INT8: return I8;
    case tensorflow::DT_UINT8: return U8;
    case tensorflow::DT_INT16: return I16;
    case tensorflow::DT_INT32: return I32;
    case tensorflow::DT_INT64: return I64;
    case tensorflow::DT_BOOL: return BOOL;
    default: return -1;
    }
}

void reduce(const Tensor& t, int code, acc_t* a) {
    acc_init(a);
    const int64_t n = t.NumElements();
    if (n > 0) run(t.tensor_data().data(), n, code, a);
}

class OpscopeStatsOp : public OpKernel {
  public:
    explicit OpscopeStatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

    void Compute(OpKernelContext* ctx) override {
        tensorflow::OpInputList values;
        OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
        const int64_t m = values.size();
        std::vector<int> codes(m);
        int64_t ndims = 0;
        for (int64_t i = 0; i < m; i++) {
            codes[i] = code_of(values[i].dtype());
            OP_REQUIRES(ctx, codes[i] >= 0,
                        tensorflow::errors::InvalidArgument("OpscopeStats: a dtype its kernel does not read: ",
                                                            tensorflow::DataTypeString(values[i].dtype())));
            ndims += 1 + values[i].dims();
        }
        Tensor* stats = nullptr;
        Tensor* dims = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({10, m}), &stats));
        OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({ndims}), &dims));
        int64_t* d = dims->flat<int64_t>().data();
        for (int64_t i = 0; i < m; i++) {
            *d++ = values[i].dims();
            for (int k = 0; k < values[i].dims(); k++) *d++ = values[i].dim_size(k);
        }
        std::vector<acc_t> accs(m);
        for (int64_t i = 0; i < m; i++) reduce(values[i], codes[i], &accs[i]);
        double* out = stats->flat<double>().data();
        for (int64_t i = 0; i < m; i++) finish_column(&accs[i], values[i].NumElements(), out, m, i);
    }
};

}  // namespace

REGISTER_OP("OpscopeStats")
    .Input("values: T")
    .Output("stats: float64")
    .Output("dims: int64")
    .Attr("T: list({float, double, half, bfloat16, int8, uint8, int16, int32, int64, bool}) >= 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
        c->set_output(0, c->Matrix(10, c->num_inputs()));
        c->set_output(1, c->Vector(c->UnknownDim()));
        return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("OpscopeStats").Device(tensorflow::DEVICE_CPU), OpscopeStatsOp);
