// The names and ranges of a placeholder's dynamic dims (Graph::placeholder's DimSpecs) as its
// node's attributes: dim_names (one name per dim, "" when free, joined by '\n'), dim_min and
// dim_max (one per dim; max -1: no bound). Packages store them like any attribute.
#pragma once

#include <string>
#include <vector>

#include "kiln/attrs.h"
#include "kiln/graph.h"

namespace kiln::detail {

inline constexpr const char* kDimNames = "dim_names";
inline constexpr const char* kDimMin = "dim_min";
inline constexpr const char* kDimMax = "dim_max";
// batch buckets (DimSpec::buckets): their count per dim, and all of them one dim after another
inline constexpr const char* kDimBucketCounts = "dim_bucket_counts";
inline constexpr const char* kDimBuckets = "dim_buckets";

/// Per dim of a placeholder of rank `rank`: its name, min and max (no names and no bounds when
/// the attributes have none). Throws ShapeError when they are not one per dim.
struct DimAttrs {
  std::vector<std::string> names;
  std::vector<int64_t> mins, maxs;
  std::vector<std::vector<int64_t>> buckets = {};  // (empty, or one list per dim)
};
DimAttrs dim_attrs(const Attrs& attrs, size_t rank);
/// Writes them (one entry per dim).
void set_dim_attrs(Attrs& attrs, const DimAttrs& dims);
/// The DimSpecs of the dims that have a name or a range.
std::vector<DimSpec> dim_specs(const Attrs& attrs, size_t rank);

}  // namespace kiln::detail
