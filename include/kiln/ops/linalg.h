// Factorizations, triangular solves and einsum.
#pragma once

#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// Cholesky factor of symmetric positive-definite matrices a (..., n, n): lower L with
/// a = L Lᵀ, or upper U with a = Uᵀ U. Reads only that triangle of a (the other is never
/// looked at, and gets no gradient). A matrix that is not positive definite gives all-NaN.
Tensor cholesky(const Tensor& a, bool upper = false);

struct TriangularSolveOptions {
  /// a is upper triangular (else lower); only that triangle is read.
  bool upper = false;
  /// Solve op(a) x = b (else x op(a) = b).
  bool left = true;
  /// op(a) = aᵀ (else a).
  bool transpose = false;
  /// The diagonal of a is taken as ones (and not read).
  bool unit_diagonal = false;
};

/// Solves with triangular a (..., n, n): b is (..., n, k) when left, (..., k, n) otherwise;
/// batch dims broadcast. A zero on the diagonal gives inf/NaN, as in back substitution.
Tensor triangular_solve(const Tensor& a, const Tensor& b,
                        const TriangularSolveOptions& options = {});

/// numpy.einsum over graph tensors ("ij,jk->ik", "bhqd,bhkd->bhqk", "ii->i", "...ij->...ji"):
/// lowered to transpose, reshape, matmul, sum and diagonal masks (repeated indices need static
/// dims). Throws ValueError for malformed equations and ShapeError for dims that disagree.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);

}  // namespace kiln
