#pragma once
// Declarations of the CPU kernels (one file per family in ops/cpu/); register_kernels.cpp puts
// them into the CPU table. Signatures are those of ops::Kernels.
#include "kiln/ops/kernels.h"

namespace kiln::ops::cpu {

void copy(const Tensor& src, const Tensor& dst);
void fill(const Tensor& dst, double value);
void arange(const Tensor& dst, double start, double step);
void random(const Tensor& dst, RandomKind kind, std::uint64_t seed, std::uint64_t offset, double a, double b);
void unary(UnaryOp op, const Tensor& in, const Tensor& out, double param);
void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& in, const Tensor& out, const Tensor& grad_in,
                    double param);
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out);
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& in, double lo, double hi, const Tensor& out);
void reduce(ReduceOp op, const Tensor& in, std::span<const int> dims, const Tensor& out);
void variance(const Tensor& in, std::span<const int> dims, int correction, const Tensor& out);
void arg_reduce(bool is_max, const Tensor& in, int dim, const Tensor& out);
void gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool ta, bool tb, double alpha, double beta);

void augment_images(const Tensor& images, const Tensor& indices, const Tensor& out, const AugmentParams& p);

}  // namespace kiln::ops::cpu
